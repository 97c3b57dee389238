//! Per-connection protocol state: what CONNECT negotiated, topic aliases,
//! keep alive and the outbox the shell drains.

use super::hash::HashMap;
use super::ids::SessionId;
use super::moment::Moment;
use super::outbox::Outbox;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::time::{Duration, Instant};
use zerofan_codec::{MqttStr, Protocol, Will};

/// Where a connection is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Waiting for CONNECT until the deadline.
    AwaitingConnect,
    /// CONNECT received for a client id whose session still has an open
    /// connection: it waits until that connection's input is handled (see
    /// `Broker::input_drained`), its own further input held by the shell.
    AwaitingTakeover,
    /// CONNECT received; its login waits for the HTTP service's answer
    /// (see `http_auth`), its further input held by the shell.
    AwaitingAuth,
    /// CONNECT accepted; attached to a session.
    Connected(SessionId),
    /// The broker decided to close it; the outbox is flushed, then closed.
    Closing,
}

/// A [`Phase`] in 8 bytes where the enum takes 16: `Connected` as its
/// session's id, the others as a low half of zero (which no session id has:
/// its low half is a slot's index plus one, see `slots.rs`) and a number in
/// the high half.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PackedPhase(u64);

impl PackedPhase {
    #[inline]
    fn pack(phase: Phase) -> PackedPhase {
        PackedPhase(match phase {
            Phase::AwaitingConnect => 0,
            Phase::AwaitingTakeover => 1 << 32,
            Phase::AwaitingAuth => 2 << 32,
            Phase::Closing => 3 << 32,
            Phase::Connected(sid) => {
                debug_assert!(sid.0 as u32 != 0, "a session id names a slot");
                sid.0
            }
        })
    }

    #[inline]
    fn unpack(self) -> Phase {
        if self.0 as u32 != 0 {
            return Phase::Connected(SessionId(self.0));
        }
        match self.0 >> 32 {
            0 => Phase::AwaitingConnect,
            1 => Phase::AwaitingTakeover,
            2 => Phase::AwaitingAuth,
            _ => Phase::Closing,
        }
    }
}

/// A peer's address in 16 bytes where a `SocketAddr` takes 32 (every
/// connection keeps one, for logs, login throttling and the admin API).
/// An IPv6 peer's address is boxed: inline it made this 24 bytes, and
/// every connection 8 bytes more, for what most fleets reach over IPv4.
/// An IPv6 address keeps its scope id (a link-local peer's interface,
/// shown in logs); its flow info is not kept: it labels a flow, not the
/// peer, and no log or API shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PeerAddr {
    /// IPv4.
    V4(SocketAddrV4),
    /// IPv6 without the flow info.
    V6(Box<PeerV6>),
}

/// An IPv6 peer's address (see [`PeerAddr`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PeerV6 {
    ip: Ipv6Addr,
    port: u16,
    /// Zero: none.
    scope_id: u32,
}

impl PeerAddr {
    /// The address as the shell gave it (flow info zero).
    pub(crate) fn addr(&self) -> SocketAddr {
        match self {
            PeerAddr::V4(a) => SocketAddr::V4(*a),
            PeerAddr::V6(a) => SocketAddr::V6(SocketAddrV6::new(a.ip, a.port, 0, a.scope_id)),
        }
    }

    /// The IP address.
    pub(crate) fn ip(&self) -> IpAddr {
        match self {
            PeerAddr::V4(a) => IpAddr::V4(*a.ip()),
            PeerAddr::V6(a) => IpAddr::V6(a.ip),
        }
    }
}

impl From<SocketAddr> for PeerAddr {
    fn from(a: SocketAddr) -> Self {
        match a {
            SocketAddr::V4(a) => PeerAddr::V4(a),
            SocketAddr::V6(a) => PeerAddr::V6(Box::new(PeerV6 {
                ip: *a.ip(),
                port: a.port(),
                scope_id: a.scope_id(),
            })),
        }
    }
}

impl fmt::Display for PeerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.addr().fmt(f)
    }
}

/// A connection's topic aliases (MQTT 5).
#[derive(Debug, Default)]
pub(crate) struct Aliases {
    /// Aliases we established towards the client.
    pub outgoing: HashMap<MqttStr, u16>,
    /// Aliases the client established.
    pub incoming: HashMap<u16, MqttStr>,
}

/// One network connection as the core sees it.
#[derive(Debug)]
pub(crate) struct Connection {
    /// Peer address, for logs, login throttling and the admin API.
    pub peer: PeerAddr,
    /// Where it is in its life ([`Connection::phase`]).
    phase: PackedPhase,
    /// Protocol from CONNECT (3.1.1 until then).
    pub protocol: Protocol,
    /// Keep alive in force, in seconds (zero: off).
    pub keep_alive: u16,
    /// When the last packet arrived, against the core's start (see
    /// [`Connection::touch`]).
    last_activity: Moment,
    /// The client's Maximum Packet Size (what we may send).
    pub max_packet_out: u32,
    /// Outbound window: min(client's Receive Maximum, our cap).
    pub send_window: u16,
    /// The client's Topic Alias Maximum (what we may use outbound).
    pub alias_max_out: u16,
    /// Topic aliases in both directions, allocated on first use (most
    /// connections never use one).
    pub aliases: Option<Box<Aliases>>,
    /// Request Problem Information.
    pub problem_info: bool,
    /// The will from CONNECT (its Will Delay Interval among its
    /// properties), until a normal DISCONNECT clears it.
    pub will: Option<Box<Will>>,
    /// Packets and deliveries waiting for the writer.
    pub outbox: Outbox,
    /// Whether the shell has already been told to wake this writer.
    pub woken: bool,
    /// A bridge (mosquitto's `try_private` mark on CONNECT): its
    /// subscriptions act with No Local and Retain As Published, as
    /// mosquitto treats bridges, so that two brokers bridged both ways do
    /// not echo each other's messages.
    pub bridge: bool,
    /// The listener's index ([`Connection::listener`]); here beside the
    /// other small fields rather than in `sec`, whose padding it made 8
    /// bytes longer (every connection holds one, parked or not).
    listener: u16,
    /// Certificate identity, username, limits (see `auth`).
    pub sec: super::auth::ConnSecurity,
}

impl Connection {
    /// A connection that has not sent CONNECT yet, opened at `at` (made
    /// against the core's start, as for [`Connection::touch`]).
    pub(crate) fn new(peer: SocketAddr, at: Moment) -> Self {
        Connection {
            peer: peer.into(),
            phase: PackedPhase::pack(Phase::AwaitingConnect),
            protocol: Protocol::V311,
            keep_alive: 0,
            last_activity: at,
            max_packet_out: u32::MAX,
            send_window: u16::MAX,
            alias_max_out: 0,
            aliases: None,
            problem_info: true,
            will: None,
            outbox: Outbox::default(),
            woken: false,
            bridge: false,
            listener: 0,
            sec: Default::default(),
        }
    }

    /// A packet arrived at `at` (made against the core's start).
    #[inline]
    pub(crate) fn touch(&mut self, at: Moment) {
        self.last_activity = at;
    }

    /// The index of the listener it came in on.
    pub(crate) fn listener(&self) -> usize {
        usize::from(self.listener)
    }

    /// Set the listener's index. Configurations hold fewer than 65,535
    /// listeners (`Config::validate`); a larger index reads as the last.
    pub(crate) fn set_listener(&mut self, listener: usize) {
        self.listener = u16::try_from(listener).unwrap_or(u16::MAX);
    }

    /// Where it is in its life.
    #[inline]
    pub(crate) fn phase(&self) -> Phase {
        self.phase.unpack()
    }

    #[inline]
    pub(crate) fn set_phase(&mut self, phase: Phase) {
        self.phase = PackedPhase::pack(phase);
    }

    /// Set the phase; the one it had.
    pub(crate) fn replace_phase(&mut self, phase: Phase) -> Phase {
        std::mem::replace(&mut self.phase, PackedPhase::pack(phase)).unpack()
    }

    /// The session, when connected.
    pub(crate) fn session(&self) -> Option<SessionId> {
        match self.phase() {
            Phase::Connected(s) => Some(s),
            _ => None,
        }
    }

    /// When keep alive runs out (1.5 times the interval after the last
    /// packet); `base` is the core's start, which its moments count from.
    pub(crate) fn keep_alive_deadline(&self, base: Instant) -> Option<Instant> {
        if self.keep_alive == 0 {
            return None;
        }
        let last = self.last_activity.get(base)?;
        Some(last + Duration::from_millis(u64::from(self.keep_alive) * 1500))
    }

    /// The topic aliases, allocated now if never used.
    pub(crate) fn aliases_mut(&mut self) -> &mut Aliases {
        self.aliases.get_or_insert_with(Box::default)
    }
}

#[cfg(test)]
mod tests {
    /// Every connection and every session is a slot of a `SlotTable`
    /// (its size and a 4-byte generation, rounded to 8): a field that
    /// pushes either over a multiple of 8 costs 8 bytes per connection
    /// (`tests/scale_state.rs` counts the total). `Connection` uses 104
    /// bytes of 104 and `Session` 87 of 88 (160 and 128 before the last
    /// activity as a `Moment`, the listener beside the small fields, a
    /// boxed IPv6 peer, the packed phase, boxed outbox and session queue,
    /// the pending will in `Flight`, and an inline client id, which took 8
    /// bytes and saved an allocation).
    #[test]
    fn a_connection_and_its_session_fit_their_size_classes() {
        assert_eq!(std::mem::size_of::<super::Connection>(), 104);
        assert_eq!(std::mem::size_of::<super::super::session::Session>(), 88);
    }

    /// Every phase comes back as it was packed, a session's id in the
    /// first and last slots and generations included.
    #[test]
    fn a_packed_phase_comes_back_as_given() {
        use super::{PackedPhase, Phase, SessionId};
        let mut phases = vec![
            Phase::AwaitingConnect,
            Phase::AwaitingTakeover,
            Phase::AwaitingAuth,
            Phase::Closing,
        ];
        for raw in [1, 7, u64::from(u32::MAX), (5 << 32) | 1, u64::MAX] {
            phases.push(Phase::Connected(SessionId(raw)));
        }
        for p in phases {
            assert_eq!(PackedPhase::pack(p).unpack(), p);
        }
        assert_eq!(std::mem::size_of::<PackedPhase>(), 8);
    }

    /// The compact peer address gives back what the shell gave, IPv6 scope
    /// and an IPv4-mapped IPv6 address (not turned into IPv4) included.
    #[test]
    fn a_peer_address_comes_back_as_given() {
        use super::PeerAddr;
        use std::net::SocketAddr;
        for text in [
            "192.0.2.7:1883",
            "[2001:db8::1]:8883",
            "[fe80::1%3]:1883",
            "[::ffff:192.0.2.7]:1883",
        ] {
            let a: SocketAddr = text.parse().unwrap();
            let p = PeerAddr::from(a);
            assert_eq!(p.addr(), a);
            assert_eq!(p.ip(), a.ip());
            assert_eq!(p.to_string(), text);
        }
        assert_eq!(std::mem::size_of::<PeerAddr>(), 16);
    }
}
