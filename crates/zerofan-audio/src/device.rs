//! Device discovery and selection on every cpal host of the platform.
//!
//! Loopback (recording what the machine plays) differs per platform, so it
//! is surfaced as ordinary entries with `is_loopback: true`:
//! - Linux, PulseAudio host (also PipeWire through pipewire-pulse): every
//!   sink has a monitor source, `<sink>.monitor`, listed as an input. Through
//!   the ALSA host, the `pulse` PCM records whatever `PULSE_SOURCE` names.
//! - Windows (WASAPI) and macOS 14.6+ (CoreAudio): cpal records an output
//!   device when an input stream is built on it; each output device is
//!   listed a second time with the id prefix `loopback:`.
//!
//! The selector `"loopback"` picks the default output's loopback on any of
//! them.

use cpal::traits::{DeviceTrait, HostTrait};

use crate::error::AudioError;
use crate::format::{DeviceSelector, SampleFormat};

/// Prefix of the ids of output devices recorded as loopback (Windows, macOS).
pub const LOOPBACK_PREFIX: &str = "loopback:";

/// The selector that means "what the default output plays".
pub const DEFAULT_LOOPBACK: &str = "loopback";

/// A device's default capture configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DefaultConfig {
    /// Frames per second.
    pub sample_rate: u32,
    /// Channels.
    pub channels: u16,
    /// cpal's name of the device's native sample format (`"f32"`, `"i16"`,
    /// `"i32"`, ...). Captures deliver i16 or f32 whatever it is.
    pub sample_format: String,
}

/// One capture source, from [`list_devices`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Unique id to pass back as the device selector: `"HOST:ID"` as cpal
    /// prints a `DeviceId` (`"pulseaudio:zf_null.monitor"`, `"alsa:pulse"`),
    /// with [`LOOPBACK_PREFIX`] in front for loopback of an output device.
    pub id: String,
    /// The host (audio API) name: `"ALSA"`, `"PulseAudio"`, `"WASAPI"`,
    /// `"CoreAudio"`...
    pub host: String,
    /// Human-readable name.
    pub name: String,
    /// The host's default input (or, for loopback entries, default output).
    pub is_default: bool,
    /// Records what an output plays rather than a microphone.
    pub is_loopback: bool,
    /// The default configuration, `None` if the device would not say.
    pub default_config: Option<DefaultConfig>,
}

/// A device picked by a selector, ready to open.
pub(crate) struct Chosen {
    pub device: cpal::Device,
    /// Build an input stream on an output device (WASAPI/CoreAudio loopback):
    /// configs then come from the output side.
    pub output_side: bool,
    pub info: DeviceInfo,
}

fn sample_format_name(f: cpal::SampleFormat) -> String {
    f.to_string()
}

/// Our format for a cpal format, if it is one we take directly.
pub(crate) fn our_format(f: cpal::SampleFormat) -> Option<SampleFormat> {
    match f {
        cpal::SampleFormat::I16 => Some(SampleFormat::I16),
        cpal::SampleFormat::F32 => Some(SampleFormat::F32),
        _ => None,
    }
}

fn default_config(device: &cpal::Device, output_side: bool) -> Option<DefaultConfig> {
    let c = if output_side {
        device.default_output_config()
    } else {
        device.default_input_config()
    }
    .ok()?;
    Some(DefaultConfig {
        sample_rate: c.sample_rate(),
        channels: c.channels(),
        sample_format: sample_format_name(c.sample_format()),
    })
}

fn id_string(device: &cpal::Device) -> Option<String> {
    device.id().ok().map(|id| id.to_string())
}

fn name_of(device: &cpal::Device) -> String {
    device
        .description()
        .map(|d| d.name().to_owned())
        .unwrap_or_else(|_| id_string(device).unwrap_or_default())
}

/// Whether this platform records output devices through input streams.
const OUTPUT_LOOPBACK: bool = cfg!(any(windows, target_os = "macos"));

/// Every capture source on every available host: inputs (PulseAudio
/// monitors flagged as loopback) and, on Windows and macOS, each output
/// device as a loopback source. Devices that fail to describe themselves
/// are skipped; a host that fails to enumerate is skipped.
pub fn list_devices() -> Vec<DeviceInfo> {
    let mut out = Vec::new();
    for host_id in cpal::available_hosts() {
        let Ok(host) = cpal::host_from_id(host_id) else {
            continue;
        };
        list_host(&host, &mut out);
    }
    out
}

fn list_host(host: &cpal::Host, out: &mut Vec<DeviceInfo>) {
    let host_name = host.id().name().to_owned();
    let default_in = host.default_input_device().and_then(|d| id_string(&d));
    let default_out = host.default_output_device().and_then(|d| id_string(&d));
    if let Ok(devices) = host.input_devices() {
        for d in devices {
            let Some(id) = id_string(&d) else { continue };
            let is_loopback = host.id().name() == "PulseAudio" && id.ends_with(".monitor");
            out.push(DeviceInfo {
                is_default: default_in.as_deref() == Some(id.as_str()),
                name: name_of(&d),
                default_config: default_config(&d, false),
                host: host_name.clone(),
                is_loopback,
                id,
            });
        }
    }
    if OUTPUT_LOOPBACK {
        if let Ok(devices) = host.output_devices() {
            for d in devices {
                let Some(id) = id_string(&d) else { continue };
                out.push(DeviceInfo {
                    is_default: default_out.as_deref() == Some(id.as_str()),
                    name: format!("Loopback: {}", name_of(&d)),
                    default_config: default_config(&d, true),
                    host: host_name.clone(),
                    is_loopback: true,
                    id: format!("{LOOPBACK_PREFIX}{id}"),
                });
            }
        }
    }
}

/// `known_default`: whether this is the host's default device, when the
/// caller picked it as such.
fn chosen(
    device: cpal::Device,
    host: &cpal::Host,
    output_side: bool,
    known_default: Option<bool>,
) -> Chosen {
    let id = id_string(&device).unwrap_or_default();
    let default_cfg = default_config(&device, output_side);
    // Asking the host costs a server round trip on PulseAudio: skip it
    // when the caller already knows.
    let is_default = known_default.unwrap_or_else(|| {
        let default = if output_side {
            host.default_output_device()
        } else {
            host.default_input_device()
        };
        default.and_then(|d| id_string(&d)) == Some(id.clone())
    });
    let is_loopback = output_side || id.ends_with(".monitor");
    Chosen {
        info: DeviceInfo {
            id: if output_side {
                format!("{LOOPBACK_PREFIX}{id}")
            } else {
                id
            },
            host: host.id().name().to_owned(),
            name: name_of(&device),
            is_default,
            is_loopback,
            default_config: default_cfg,
        },
        device,
        output_side,
    }
}

/// Resolves a selector to a device (see [`DeviceSelector::Named`] for the
/// matching order).
pub(crate) fn choose(selector: &DeviceSelector) -> Result<Chosen, AudioError> {
    match selector {
        DeviceSelector::Default => {
            let host = cpal::default_host();
            let device = host
                .default_input_device()
                .ok_or_else(|| AudioError::DeviceNotFound {
                    wanted: "default input".into(),
                    available: names(),
                })?;
            Ok(chosen(device, &host, false, Some(true)))
        }
        DeviceSelector::Named(wanted) if wanted == DEFAULT_LOOPBACK => default_loopback(),
        DeviceSelector::Named(wanted) => find_named(wanted),
    }
}

fn default_loopback() -> Result<Chosen, AudioError> {
    let host = cpal::default_host();
    if OUTPUT_LOOPBACK {
        if let Some(out) = host.default_output_device() {
            return Ok(chosen(out, &host, true, Some(true)));
        }
    } else if let Some(sink) = host.default_output_device().and_then(|d| id_string(&d)) {
        // PulseAudio: the default sink's monitor source.
        if let Some(local) = sink.split_once(':').map(|(_, l)| l.to_owned()) {
            return find_named(&format!("{local}.monitor"));
        }
    }
    Err(AudioError::DeviceNotFound {
        wanted: format!(
            "{DEFAULT_LOOPBACK} (the default output's loopback; on Linux it needs a \
             PulseAudio/PipeWire server: pick a `.monitor` source)"
        ),
        available: names(),
    })
}

fn find_named(wanted: &str) -> Result<Chosen, AudioError> {
    let (want, output_side) = match wanted.strip_prefix(LOOPBACK_PREFIX) {
        Some(rest) => (rest, true),
        None => (wanted, false),
    };
    // A full id names its host: open that host alone. Creating every host
    // and listing all its devices (a PulseAudio connection and two server
    // round trips, ALSA's hint walk) cost tens of milliseconds per host
    // per pass, and start-up is what users wait for.
    if let Some(found) = by_full_id(want, output_side) {
        return Ok(found);
    }
    // Then an id within its host, then a name, each host listed once (not
    // once per pass, and the hosts after the one that has the id not at
    // all).
    let mut listed: Vec<(cpal::Host, Vec<cpal::Device>)> = Vec::new();
    for host_id in cpal::available_hosts() {
        let Ok(host) = cpal::host_from_id(host_id) else {
            continue;
        };
        let devices = if output_side {
            host.output_devices().map(|d| d.collect::<Vec<_>>())
        } else {
            host.input_devices().map(|d| d.collect::<Vec<_>>())
        };
        let Ok(mut devices) = devices else { continue };
        let local_id = |d: &cpal::Device| d.id().is_ok_and(|id| id.id() == want);
        if let Some(i) = devices.iter().position(local_id) {
            return Ok(chosen(devices.swap_remove(i), &host, output_side, None));
        }
        listed.push((host, devices));
    }
    for (host, devices) in &mut listed {
        if let Some(i) = devices.iter().position(|d| name_of(d) == want) {
            return Ok(chosen(devices.swap_remove(i), host, output_side, None));
        }
    }
    Err(AudioError::DeviceNotFound {
        wanted: wanted.to_owned(),
        available: names(),
    })
}

/// The device whose full id (`"HOST:ID"`, host ignoring ASCII case) is
/// `want`, looked up on that host only; `None` if `want` names no host of
/// this platform or that host has no such capture (or, for loopback,
/// output) device.
fn by_full_id(want: &str, output_side: bool) -> Option<Chosen> {
    let id: cpal::DeviceId = want.parse().ok()?;
    let host = cpal::host_from_id(id.host()).ok()?;
    let device = host.device_by_id(&id)?;
    let usable = if output_side {
        device.supports_output()
    } else {
        device.supports_input()
    };
    usable.then(|| chosen(device, &host, output_side, None))
}

fn names() -> Vec<String> {
    list_devices()
        .into_iter()
        .map(|d| format!("{} ({})", d.id, d.name))
        .collect()
}

/// Ranges of stream configurations the chosen device supports for capture.
pub(crate) fn supported_ranges(c: &Chosen) -> Vec<cpal::SupportedStreamConfigRange> {
    let r = if c.output_side {
        c.device
            .supported_output_configs()
            .map(|i| i.collect::<Vec<_>>())
    } else {
        c.device
            .supported_input_configs()
            .map(|i| i.collect::<Vec<_>>())
    };
    r.unwrap_or_default()
}
