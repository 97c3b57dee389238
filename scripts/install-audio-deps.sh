#!/usr/bin/env bash
# Installs what crates/zerofan-audio needs on Debian/Ubuntu, only when
# missing (idempotent; prints "audio deps: all present" otherwise):
#
#   libasound2-dev pkg-config   build: cpal's ALSA backend links libasound
#                               through alsa-sys, found with pkg-config. The
#                               whole workspace needs these to build once
#                               zerofan-audio is a member.
#   pulseaudio pulseaudio-utils tests: a throwaway PulseAudio server with a
#                               null sink (pacat plays the test tone into it)
#   libasound2-plugins          tests: ALSA's `pulse` PCM, so the ALSA host
#                               can capture from PulseAudio too
#   sox                         tests: synthesises the 440 Hz test tone
#
# Runs apt-get as root, or through sudo otherwise. On other systems it only
# says what is missing and fails.
set -euo pipefail

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

missing=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

if command -v dpkg-query >/dev/null 2>&1; then
    for p in libasound2-dev pkg-config pulseaudio pulseaudio-utils libasound2-plugins sox; do
        have_pkg "$p" || missing+=("$p")
    done
else
    pkg-config --exists alsa 2>/dev/null || missing+=(libasound2-dev/pkg-config)
    command -v pulseaudio >/dev/null 2>&1 || missing+=(pulseaudio)
    command -v pacat >/dev/null 2>&1 || missing+=(pulseaudio-utils)
    command -v sox >/dev/null 2>&1 || missing+=(sox)
    if [ ${#missing[@]} -gt 0 ]; then
        echo "audio deps: missing ${missing[*]} and no apt here: install them by hand" >&2
        exit 1
    fi
fi

if [ ${#missing[@]} -eq 0 ]; then
    echo "audio deps: all present"
    exit 0
fi

echo "audio deps: installing ${missing[*]}"
as_root apt-get update -qq
as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
