//! Broker counters, published under `$SYS/` and on `/metrics`, and
//! readable by tests.
//!
//! Each counter is declared once, in a [`counters!`] block: its field, its
//! help text, its name under `$SYS/broker/`, its Prometheus family (and the
//! label that tells it from the family's other members), and whether it
//! counts in [`Metrics::dropped_total`] or
//! [`SecurityMetrics::refusals_total`](super::limits::SecurityMetrics::refusals_total).
//! `$SYS` (`sys::sys_figures`) and `/metrics` (`shell::prometheus`) walk
//! the declarations with `each`, so a new counter shows in both without
//! being named anywhere else.

/// A Prometheus metric family: one `# HELP` / `# TYPE` and its samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Family {
    /// The family's name (a counter's ends in `_total`).
    pub name: &'static str,
    /// Its `# HELP` text.
    pub help: &'static str,
}

impl Family {
    pub(crate) const fn new(name: &'static str, help: &'static str) -> Family {
        Family { name, help }
    }
}

/// How a counter's samples are labelled within its family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Label {
    /// The family's only counter: one unlabelled sample.
    None,
    /// One sample with this label (name, value).
    One(&'static str, &'static str),
    /// A `[u64; 3]` by QoS: three samples labelled `qos="0"`, `"1"`, `"2"`.
    Qos,
}

/// Which derived total a counter adds to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sum {
    /// Neither.
    None,
    /// A message dropped ([`Metrics::dropped_total`]).
    Dropped,
    /// A refusal ([`SecurityMetrics::refusals_total`](super::limits::SecurityMetrics::refusals_total)).
    Refused,
}

/// Where one counter shows: built with the `const` methods below in the
/// counter's declaration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CounterDef {
    /// Its name under `$SYS/broker/` (none: `/metrics` only).
    pub sys: Option<&'static str>,
    /// Its Prometheus family (none: `$SYS` only) and label.
    pub prom: Option<(Family, Label)>,
    /// The derived total it adds to.
    pub sum: Sum,
}

impl CounterDef {
    /// Nowhere yet: add `.sys(...)` and / or `.prom(...)`.
    pub(crate) const NEW: CounterDef = CounterDef {
        sys: None,
        prom: None,
        sum: Sum::None,
    };

    pub(crate) const fn sys(self, name: &'static str) -> Self {
        CounterDef {
            sys: Some(name),
            ..self
        }
    }

    /// The only counter of `family`.
    pub(crate) const fn prom(self, family: Family) -> Self {
        CounterDef {
            prom: Some((family, Label::None)),
            ..self
        }
    }

    /// One of several counters of `family`, told apart by `label="value"`.
    pub(crate) const fn prom_as(
        self,
        family: Family,
        label: &'static str,
        value: &'static str,
    ) -> Self {
        CounterDef {
            prom: Some((family, Label::One(label, value))),
            ..self
        }
    }

    /// A `[u64; 3]` by QoS in `family`.
    pub(crate) const fn prom_by_qos(self, family: Family) -> Self {
        CounterDef {
            prom: Some((family, Label::Qos)),
            ..self
        }
    }

    pub(crate) const fn dropped(self) -> Self {
        CounterDef {
            sum: Sum::Dropped,
            ..self
        }
    }

    pub(crate) const fn refused(self) -> Self {
        CounterDef {
            sum: Sum::Refused,
            ..self
        }
    }
}

/// A field of a `counters!` struct: a counter, a counter by QoS, or a
/// nested block of counters.
pub trait Counted {
    /// Call `f` with the field's declaration and its value(s).
    fn visit(&self, def: &CounterDef, f: &mut dyn FnMut(&CounterDef, &[u64]));
    /// Add `other`'s counts (another shard's) to these.
    fn add(&mut self, other: &Self);
}

impl Counted for u64 {
    fn visit(&self, def: &CounterDef, f: &mut dyn FnMut(&CounterDef, &[u64])) {
        f(def, std::slice::from_ref(self));
    }
    fn add(&mut self, other: &Self) {
        *self = self.saturating_add(*other);
    }
}

impl Counted for [u64; 3] {
    fn visit(&self, def: &CounterDef, f: &mut dyn FnMut(&CounterDef, &[u64])) {
        f(def, self);
    }
    fn add(&mut self, other: &Self) {
        for (a, b) in self.iter_mut().zip(other) {
            *a = a.saturating_add(*b);
        }
    }
}

/// Declares a struct of counters: each field `pub NAME: TYPE = DEF,` with
/// its doc comment, where DEF is a [`CounterDef`] (or
/// [`CounterDef::NEW`] for a nested `counters!` struct). Generates the
/// struct and `each`, which visits every counter in declaration order.
macro_rules! counters {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $(
                $(#[doc = $doc:literal])*
                pub $field:ident : $ty:ty = $def:expr,
            )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct $name {
            $( $(#[doc = $doc])* pub $field: $ty, )*
        }

        impl $name {
            /// Every counter with its declaration and value(s), in
            /// declaration order (nested blocks included).
            pub fn each(&self, f: &mut dyn FnMut(&$crate::core::CounterDef, &[u64])) {
                $( $crate::core::Counted::visit(&self.$field, &$def, f); )*
            }
        }

        impl $crate::core::Counted for $name {
            fn visit(
                &self,
                _def: &$crate::core::CounterDef,
                f: &mut dyn FnMut(&$crate::core::CounterDef, &[u64]),
            ) {
                self.each(f);
            }
            fn add(&mut self, other: &Self) {
                $( $crate::core::Counted::add(&mut self.$field, &other.$field); )*
            }
        }
    };
}
pub(crate) use counters;

const DROPPED: Family = Family::new(
    "zerofan_messages_dropped_total",
    "Messages dropped, by reason.",
);
const CONNECTION_ERRORS: Family = Family::new(
    "zerofan_connection_errors_total",
    "Connections closed by the broker for an error, by reason.",
);

counters! {
    /// Counters the core keeps. Every dropped message has a counter.
    pub struct Metrics {
        /// Connections ever opened.
        pub connections_opened: u64 = CounterDef::NEW.sys("clients/connections").prom(Family::new(
            "zerofan_connections_opened_total",
            "Network connections accepted since start.",
        )),
        /// CONNECTs accepted.
        pub clients_connected_total: u64 = CounterDef::NEW.prom(Family::new(
            "zerofan_clients_connected_total",
            "CONNECTs accepted since start.",
        )),
        /// PUBLISH packets received from clients.
        pub messages_received: u64 = CounterDef::NEW.sys("messages/received"),
        /// PUBLISH packets sent to clients.
        pub messages_sent: u64 = CounterDef::NEW.sys("messages/sent"),
        /// Payload bytes received in PUBLISH packets.
        pub payload_bytes_received: u64 = CounterDef::NEW.sys("payload/bytes/received"),
        /// Payload bytes sent in PUBLISH packets.
        pub payload_bytes_sent: u64 = CounterDef::NEW.sys("payload/bytes/sent"),
        /// PUBLISH packets received, by QoS (index 0, 1, 2).
        pub messages_received_by_qos: [u64; 3] = CounterDef::NEW.prom_by_qos(Family::new(
            "zerofan_messages_received_total",
            "PUBLISH packets received from clients, by QoS.",
        )),
        /// PUBLISH packets sent, by QoS (index 0, 1, 2; resends included).
        pub messages_sent_by_qos: [u64; 3] = CounterDef::NEW.prom_by_qos(Family::new(
            "zerofan_messages_sent_total",
            "PUBLISH packets sent to clients, by QoS (resends included).",
        )),
        /// Payload bytes received, by QoS.
        pub payload_bytes_received_by_qos: [u64; 3] = CounterDef::NEW.prom_by_qos(Family::new(
            "zerofan_payload_bytes_received_total",
            "Payload bytes received in PUBLISH packets, by QoS.",
        )),
        /// Payload bytes sent, by QoS (resends not counted, as in `payload_bytes_sent`).
        pub payload_bytes_sent_by_qos: [u64; 3] = CounterDef::NEW.prom_by_qos(Family::new(
            "zerofan_payload_bytes_sent_total",
            "Payload bytes sent in PUBLISH packets, by QoS (resends not counted).",
        )),
        /// QoS 0 messages dropped because a session queue was full.
        pub dropped_qos0_queue_full: u64 = CounterDef::NEW
            .sys("messages/dropped/qos0_queue_full")
            .prom_as(DROPPED, "reason", "qos0_queue_full")
            .dropped(),
        /// QoS 1/2 messages dropped because a session queue was full.
        pub dropped_queue_full: u64 = CounterDef::NEW
            .sys("messages/dropped/queue_full")
            .prom_as(DROPPED, "reason", "queue_full")
            .dropped(),
        /// Messages dropped because they expired before delivery.
        pub dropped_expired: u64 = CounterDef::NEW
            .sys("messages/dropped/expired")
            .prom_as(DROPPED, "reason", "expired")
            .dropped(),
        /// Messages dropped because they exceed the client's Maximum Packet Size.
        pub dropped_too_large: u64 = CounterDef::NEW
            .sys("messages/dropped/too_large")
            .prom_as(DROPPED, "reason", "too_large")
            .dropped(),
        /// QoS 0 messages not forwarded because the destination shard's
        /// queue was full.
        pub dropped_qos0_peer_full: u64 = CounterDef::NEW
            .sys("messages/dropped/qos0_shard_full")
            .prom_as(DROPPED, "reason", "qos0_shard_full")
            .dropped(),
        /// Clients disconnected because their queue was full (`queue_full = "disconnect"`).
        pub slow_consumer_disconnects: u64 = CounterDef::NEW
            .sys("errors/slow_consumer_disconnects")
            .prom(Family::new(
                "zerofan_slow_consumer_disconnects_total",
                "Clients disconnected because their queue was full (queue_full = \"disconnect\").",
            )),
        /// Times a publisher's connection stopped being read because a
        /// subscriber it feeds went over its high-water mark (push-back).
        pub publisher_throttles: u64 = CounterDef::NEW
            .sys("load/publisher_throttles")
            .prom(Family::new(
                "zerofan_publisher_throttles_total",
                "Times a publisher was not read because a subscriber it feeds was behind (push-back).",
            )),
        /// Subscribers that stayed over their high-water mark past
        /// `slow_consumer_timeout_ms` and were dropped as slow.
        pub slow_subscribers_dropped: u64 = CounterDef::NEW
            .sys("errors/slow_subscribers_dropped")
            .prom(Family::new(
                "zerofan_slow_subscribers_dropped_total",
                "Subscribers that stayed behind past slow_consumer_timeout_ms and were dropped as slow.",
            )),
        /// Messages that crossed to another shard (one per destination).
        pub peer_forwarded: u64 = CounterDef::NEW
            .sys("shards/messages/forwarded")
            .prom(Family::new(
                "zerofan_shard_messages_forwarded_total",
                "Messages sent to another shard for its subscribers (one per destination shard).",
            )),
        /// Messages received from another shard.
        pub peer_received: u64 = CounterDef::NEW
            .sys("shards/messages/received")
            .prom(Family::new(
                "zerofan_shard_messages_received_total",
                "Messages received from another shard for this shard's subscribers.",
            )),
        /// Times a publisher's connection stopped being read because a shard
        /// it publishes to was full.
        pub peer_throttles: u64 = CounterDef::NEW
            .sys("shards/publisher_throttles")
            .prom(Family::new(
                "zerofan_shard_publisher_throttles_total",
                "Times a publisher's input was held because a shard it publishes to was full.",
            )),
        /// Times a connection stopped being read because it had
        /// `peer::DEFERRED_PER_CONN` outputs (SUBACKs, acknowledgements)
        /// waiting for the other shards or nodes.
        pub peer_deferred_holds: u64 = CounterDef::NEW
            .sys("shards/deferred_holds")
            .prom(Family::new(
                "zerofan_shard_deferred_holds_total",
                "Times a connection's input was held because too many of its SUBACKs or acknowledgements waited for other shards or nodes.",
            )),
        /// Malformed packets received.
        pub malformed_packets: u64 = CounterDef::NEW
            .sys("errors/malformed")
            .prom_as(CONNECTION_ERRORS, "reason", "malformed_packet"),
        /// Protocol violations (connections closed by the broker for them).
        pub protocol_errors: u64 = CounterDef::NEW
            .sys("errors/protocol")
            .prom_as(CONNECTION_ERRORS, "reason", "protocol_error"),
        /// Keep alive timeouts.
        pub keep_alive_timeouts: u64 = CounterDef::NEW
            .sys("errors/keepalive_timeouts")
            .prom_as(CONNECTION_ERRORS, "reason", "keep_alive_timeout"),
        /// Connections that never sent CONNECT in time.
        pub connect_timeouts: u64 = CounterDef::NEW
            .sys("errors/connect_timeouts")
            .prom_as(CONNECTION_ERRORS, "reason", "connect_timeout"),
        /// Connections closed at once after their FIN, not read on for a
        /// moment, because as many sockets lingered already (see
        /// `shell/linger.rs`).
        pub lingers_skipped: u64 = CounterDef::NEW
            .sys("clients/lingers_skipped")
            .prom(Family::new(
                "zerofan_connection_lingers_skipped_total",
                "Closed connections not read on after their FIN because too many sockets lingered already.",
            )),
        /// Sessions taken over by a new connection with the same client id.
        pub takeovers: u64 = CounterDef::NEW.sys("sessions/takeovers").prom(Family::new(
            "zerofan_session_takeovers_total",
            "Sessions taken over by a new connection with the same client id.",
        )),
        /// Takeovers completed by their deadline because the old connection's
        /// input was not drained in time (it did not read, its outbox was full).
        pub takeover_drain_timeouts: u64 = CounterDef::NEW
            .sys("sessions/takeover_drain_timeouts")
            .prom(Family::new(
                "zerofan_session_takeover_drain_timeouts_total",
                "Takeovers completed by their deadline before the old connection's input was all read.",
            )),
        /// CONNECTs refused because the cluster could not give this node
        /// their client id (no majority reachable).
        pub claims_refused: u64 = CounterDef::NEW
            .sys("cluster/claims_refused")
            .prom(Family::new(
                "zerofan_cluster_claims_refused_total",
                "CONNECTs refused because the cluster could not give this node their client id.",
            )),
        /// Claims granted here after their client left (before the answer):
        /// the copy kept here, if any, was served as an offline session.
        pub claims_left: u64 = CounterDef::NEW
            .sys("cluster/claims_left")
            .prom(Family::new(
                "zerofan_cluster_claims_left_total",
                "Client ids granted here after their client left before the answer (its copy here served offline).",
            )),
        /// Copies of a dead node's sessions adopted here to publish their
        /// wills, clean sessions' wills published included (see `orphans`).
        pub orphans_adopted: u64 = CounterDef::NEW
            .sys("cluster/orphans_adopted")
            .prom(Family::new(
                "zerofan_cluster_orphans_adopted_total",
                "Sessions of a node away or restarted adopted here from their copies to publish their clients' wills (a clean session's will: published, nothing kept).",
            )),
        /// Wills of clients dropped when this node's lease ran out, settled
        /// here once it was back and the id still this node's (see
        /// `orphans::FencedWill`).
        pub fenced_wills_settled: u64 = CounterDef::NEW
            .sys("cluster/fenced_wills_settled")
            .prom(Family::new(
                "zerofan_cluster_fenced_wills_settled_total",
                "Wills of clients dropped when this node's lease ran out, published (or left pending for their delay) here once the lease was back and the client id still this node's.",
            )),
        /// Unanswered claims of clients that left, forgotten (too many).
        pub claims_left_forgotten: u64 = CounterDef::NEW
            .sys("cluster/claims_left_forgotten")
            .prom(Family::new(
                "zerofan_cluster_claims_left_forgotten_total",
                "Unanswered claims of clients that left, forgotten because too many waited.",
            )),
        /// Sessions whose full image went to the node that took their
        /// client id over, which was not among this node's replicas.
        pub sessions_handed_over: u64 = CounterDef::NEW
            .sys("cluster/sessions_handed_over")
            .prom(Family::new(
                "zerofan_cluster_sessions_handed_over_total",
                "Sessions whose full image went to the node that took their client id over (not a replica).",
            )),
        /// Granted claims that asked the other nodes for a copy of their
        /// session (its previous owner did not hand it over): any, when
        /// none is kept here, or a newer one.
        pub copies_asked: u64 = CounterDef::NEW
            .sys("cluster/copies_asked")
            .prom(Family::new(
                "zerofan_cluster_copies_asked_total",
                "Granted claims whose previous owner did not hand over that asked other nodes for a copy of their session (a newer one, when one is kept here).",
            )),
        /// Batches of a session's changes not applied because the copy
        /// here held them already: another node's copy no newer than it,
        /// or its owner's changes its link delivered late.
        pub replica_batches_had: u64 = CounterDef::NEW
            .sys("cluster/replica_batches_had")
            .prom(Family::new(
                "zerofan_cluster_replica_batches_had_total",
                "Batches of a session copy's changes (or another node's copy of it) not applied because the copy here held them already.",
            )),
        /// Copies kept here sent to a node that asked for one.
        pub copies_sent: u64 = CounterDef::NEW
            .sys("cluster/copies_sent")
            .prom(Family::new(
                "zerofan_cluster_copies_sent_total",
                "Session copies kept here sent to a node that was granted their client id.",
            )),
        /// Batches sent here in parts (too large for one link frame)
        /// dropped unfinished: a part out of order or past its bound
        /// (4 GiB), or its sender restarted or left between two.
        pub replica_parts_dropped: u64 = CounterDef::NEW
            .sys("cluster/replica_parts_dropped")
            .prom(Family::new(
                "zerofan_cluster_replica_parts_dropped_total",
                "Replicated batches sent to this node in parts that were dropped unfinished (a part out of order or past its bound, or the sender restarted or left).",
            )),
        /// Sessions here ended because another node claimed their client id.
        pub fenced_takeovers: u64 = CounterDef::NEW
            .sys("cluster/fenced_takeovers")
            .prom(Family::new(
                "zerofan_cluster_fenced_takeovers_total",
                "Sessions ended here because another node claimed their client id.",
            )),
        /// Acknowledgements not sent because a node they waited for went
        /// away or lost its state before it confirmed the message (their
        /// publishers were disconnected).
        pub acks_refused: u64 = CounterDef::NEW
            .sys("cluster/acks_refused")
            .prom(Family::new(
                "zerofan_cluster_acks_refused_total",
                "PUBACK/PUBREC not sent (the publisher disconnected instead) because a node the message went to went away or restarted before it confirmed having it.",
            )),
        /// Sessions that moved to another live node and were relayed there
        /// until every node had flushed (see `moves`).
        pub moves_relayed: u64 = CounterDef::NEW
            .sys("cluster/moves_relayed")
            .prom(Family::new(
                "zerofan_cluster_moves_relayed_total",
                "Persistent sessions handed to another live node whose matches were relayed there until every node had switched.",
            )),
        /// Messages relayed to a moving session's new owner.
        pub moves_relayed_messages: u64 = CounterDef::NEW
            .sys("cluster/moves_relayed_messages")
            .prom(Family::new(
                "zerofan_cluster_moves_relayed_messages_total",
                "Messages relayed to the new owner of a session moving between live nodes.",
            )),
        /// Moves into this node that finished (the old owner's relay done).
        pub moves_arrived: u64 = CounterDef::NEW
            .sys("cluster/moves_arrived")
            .prom(Family::new(
                "zerofan_cluster_moves_arrived_total",
                "Sessions moved here from a live node whose relay finished.",
            )),
        /// Moves that ended at their deadline, not all nodes flushed.
        pub moves_timed_out: u64 = CounterDef::NEW
            .sys("cluster/moves_timed_out")
            .prom(Family::new(
                "zerofan_cluster_moves_timed_out_total",
                "Session moves that ended at their 5 s deadline before every node had switched.",
            )),
        /// Moves said again to a node whose link started over.
        pub moves_retold: u64 = CounterDef::NEW
            .sys("cluster/moves_retold")
            .prom(Family::new(
                "zerofan_cluster_moves_retold_total",
                "Session moves announced or flushed again to a node whose link started over (it restarted).",
            )),
        /// Moves forgotten before their time to keep the bound on those
        /// kept to be said again.
        pub moves_told_forgotten: u64 = CounterDef::NEW
            .sys("cluster/moves_told_forgotten")
            .prom(Family::new(
                "zerofan_cluster_moves_told_forgotten_total",
                "Session moves not kept to be said again (over 1,024 within 5 s): a node restarted meanwhile waits for their deadline.",
            )),
        /// Relayed messages for no moving session here (counted, dropped).
        pub moves_relay_dropped: u64 = CounterDef::NEW
            .sys("cluster/moves_relay_dropped")
            .prom(Family::new(
                "zerofan_cluster_moves_relay_dropped_total",
                "Relayed messages dropped: no session here was moving in from their sender, or too many came early.",
            )),
        /// Relayed messages the moving session had already, in the copy it
        /// was served from (dropped).
        pub moves_relayed_had: u64 = CounterDef::NEW
            .sys("cluster/moves_relayed_had")
            .prom(Family::new(
                "zerofan_cluster_moves_relayed_had_total",
                "Relayed messages dropped because the copy the session was served from held them already.",
            )),
        /// Messages a peer forwarded that a session served here from a copy
        /// of that peer's held already (skipped for that session).
        pub forwarded_had: u64 = CounterDef::NEW
            .sys("cluster/forwarded_had")
            .prom(Family::new(
                "zerofan_cluster_forwarded_had_total",
                "Forwarded messages skipped for a session served from a copy that held them already.",
            )),
        /// Moves whose held messages reached the session's queue bound and
        /// were queued before the relay ended.
        pub moves_hold_overflows: u64 = CounterDef::NEW
            .sys("cluster/moves_hold_overflows")
            .prom(Family::new(
                "zerofan_cluster_moves_hold_overflows_total",
                "Session moves whose held messages reached the queue bound and were queued before the relay ended.",
            )),
        /// Messages published here while a node they crossed to was away,
        /// sent to every other node for that node's persistent sessions
        /// (see `strand`).
        pub stranded_sent: u64 = CounterDef::NEW
            .sys("cluster/stranded_sent")
            .prom(Family::new(
                "zerofan_cluster_stranded_sent_total",
                "Messages published here while a node with subscribers for them was away, sent to every other node for the persistent sessions of the away node.",
            )),
        /// Queue entries added to the copies here of an away node's sessions.
        pub stranded_kept: u64 = CounterDef::NEW
            .sys("cluster/stranded_kept")
            .prom(Family::new(
                "zerofan_cluster_stranded_kept_total",
                "Queue entries added to the copies kept here of an away node's persistent sessions, for messages published while it was away.",
            )),
        /// Stranded entries the copies here left out or dropped to keep
        /// within the session's queue bounds (see `strand`).
        pub stranded_dropped: u64 = CounterDef::NEW
            .sys("cluster/stranded_dropped")
            .prom(Family::new(
                "zerofan_cluster_stranded_dropped_total",
                "Messages published while a node was away that the copies kept here of its persistent sessions left out (or dropped to make room, with queue_full = \"drop_oldest\") because the session's queue was at max_queued_messages or max_queued_bytes.",
            )),
        /// Stranded entries in the copies here dropped because the owner,
        /// back, queued the same message itself (see `strand`).
        pub stranded_replaced: u64 = CounterDef::NEW
            .sys("cluster/stranded_replaced")
            .prom(Family::new(
                "zerofan_cluster_stranded_replaced_total",
                "Queue entries stranded in the copies here of a node's persistent sessions, dropped because that node, back, queued and replicated the same message itself.",
            )),
        /// Stranded entries in the copies here kept past a full image from
        /// their owner, which had not read their messages yet (see
        /// `strand`).
        pub stranded_unread: u64 = CounterDef::NEW
            .sys("cluster/stranded_unread")
            .prom(Family::new(
                "zerofan_cluster_stranded_unread_total",
                "Queue entries stranded in the copies here of a node's persistent sessions, kept when that node's full image replaced a copy before it had read their messages.",
            )),
        /// Messages stranded for a node sent to it again when it came back
        /// restarted (its link's queue lost).
        pub stranded_resent: u64 = CounterDef::NEW
            .sys("cluster/stranded_resent")
            .prom(Family::new(
                "zerofan_cluster_stranded_resent_total",
                "Messages stranded for an away node sent to it again when it came back restarted, for the sessions it still owns.",
            )),
        /// Messages stranded for a node not kept for its return: over
        /// `strand::KEEP_MAX` or `strand::KEEP_BYTES`.
        pub stranded_forgotten: u64 = CounterDef::NEW
            .sys("cluster/stranded_forgotten")
            .prom(Family::new(
                "zerofan_cluster_stranded_forgotten_total",
                "Messages stranded for an away node not kept to send it again should it come back restarted (over 10,000 messages or 64 MiB per node).",
            )),
        /// Messages queued for sessions served here since their owner went
        /// away, from a node that saw it away still.
        pub stranded_queued: u64 = CounterDef::NEW
            .sys("cluster/stranded_queued")
            .prom(Family::new(
                "zerofan_cluster_stranded_queued_total",
                "Messages queued for persistent sessions taken over here from an away node, sent by a node that did not know yet they were here.",
            )),
        /// Connections dropped because this node's cluster lease ran out.
        pub clients_fenced: u64 = CounterDef::NEW
            .sys("cluster/clients_fenced")
            .prom(Family::new(
                "zerofan_cluster_clients_fenced_total",
                "Connections dropped because this node's cluster lease ran out (no majority heard).",
            )),
        /// Operations on persistent sessions sent to replicas (one per
        /// replica).
        pub replicated_ops: u64 = CounterDef::NEW
            .sys("cluster/replicated_ops")
            .prom(Family::new(
                "zerofan_cluster_replicated_ops_total",
                "Operations on persistent sessions sent to replicas (one per replica).",
            )),
        /// Message bytes in those operations.
        pub replicated_bytes: u64 = CounterDef::NEW
            .sys("cluster/replicated_bytes")
            .prom(Family::new(
                "zerofan_cluster_replicated_bytes_total",
                "Message bytes (topic and payload) sent to replicas.",
            )),
        /// Batches of those operations sent to replicas (one per replica):
        /// each is answered once, and a replica commits at most once per
        /// link read however many it brings.
        pub replicated_batches: u64 = CounterDef::NEW
            .sys("cluster/replicated_batches")
            .prom(Family::new(
                "zerofan_cluster_replicated_batches_total",
                "Batches of session operations sent to replicas (one per replica).",
            )),
        /// Other nodes' operations kept here as a replica.
        pub replica_ops_applied: u64 = CounterDef::NEW
            .sys("cluster/replica_ops_applied")
            .prom(Family::new(
                "zerofan_cluster_replica_ops_applied_total",
                "Other nodes' session operations kept here as a replica.",
            )),
        /// Other nodes' operations refused: the replica images were full.
        pub replica_ops_refused: u64 = CounterDef::NEW
            .sys("cluster/replica_ops_refused")
            .prom(Family::new(
                "zerofan_cluster_replica_ops_refused_total",
                "Other nodes' session operations refused: replica images full.",
            )),
        /// Other nodes' operations ignored: made under an older claim of
        /// their client id than one seen here (a stale owner's).
        pub replica_stale_ops: u64 = CounterDef::NEW
            .sys("cluster/replica_stale_ops")
            .prom(Family::new(
                "zerofan_cluster_replica_stale_ops_total",
                "Other nodes' session operations ignored: made under an older claim (stale owner).",
            )),
        /// Sessions here ended because a replica reported their changes
        /// stale (another node claimed them; this node had not heard).
        pub replica_stale_sessions: u64 = CounterDef::NEW
            .sys("cluster/replica_stale_sessions")
            .prom(Family::new(
                "zerofan_cluster_replica_stale_sessions_total",
                "Sessions ended here because a replica reported their changes stale.",
            )),
        /// Copies kept here not served to a claim: the previous owner (as
        /// the cluster's log had it) had not written them, so they were
        /// stale; the client got a clean session.
        pub stale_copies_refused: u64 = CounterDef::NEW
            .sys("cluster/stale_copies_refused")
            .prom(Family::new(
                "zerofan_cluster_stale_copies_refused_total",
                "Session copies not served to a claim: older than the previous owner's.",
            )),
        /// Client ids whose newest epoch a replica forgot: its table was
        /// full (only ids with no copy there).
        pub replica_epochs_forgotten: u64 = CounterDef::NEW
            .sys("cluster/replica_epochs_forgotten")
            .prom(Family::new(
                "zerofan_cluster_replica_epochs_forgotten_total",
                "Client ids whose newest claim epoch a replica forgot: its table was full.",
            )),
        /// Queue entries a replica never wrote to its store: the batch
        /// that brought them also ended them.
        pub replica_entries_unwritten: u64 = CounterDef::NEW
            .sys("cluster/replica_entries_unwritten")
            .prom(Family::new(
                "zerofan_cluster_replica_entries_unwritten_total",
                "Queue entries a replica kept off its store: ended in the batch that brought them.",
            )),
        /// Clean takeovers' drops forgotten before every replica answered
        /// them (more than 10,000 unanswered).
        pub replica_drops_forgotten: u64 = CounterDef::NEW
            .sys("cluster/replica_drops_forgotten")
            .prom(Family::new(
                "zerofan_cluster_replica_drops_forgotten_total",
                "Clean takeovers' drops forgotten before every replica answered them.",
            )),
        /// Sessions installed from a replica image (failover).
        pub replica_installs: u64 = CounterDef::NEW
            .sys("cluster/replica_installs")
            .prom(Family::new(
                "zerofan_cluster_replica_installs_total",
                "Sessions taken over from a replica image kept here.",
            )),
        /// Full images of this node's sessions sent to a replica (new to
        /// the replica set, or back after being away).
        pub replica_images_sent: u64 = CounterDef::NEW
            .sys("cluster/replica_images_sent")
            .prom(Family::new(
                "zerofan_cluster_replica_images_sent_total",
                "Times this node sent a replica the full images of its persistent sessions (the replica new to its replica set, or back after being away).",
            )),
        /// Acknowledgements that went without an away replica's answer.
        pub replica_waits_skipped: u64 = CounterDef::NEW
            .sys("cluster/replica_waits_skipped")
            .prom(Family::new(
                "zerofan_cluster_replica_waits_skipped_total",
                "Acknowledgements that did not wait for a replica that was away.",
            )),
        /// Sessions removed because their expiry interval passed.
        pub sessions_expired: u64 = CounterDef::NEW.sys("sessions/expired").prom(Family::new(
            "zerofan_sessions_expired_total",
            "Sessions removed because their expiry interval passed.",
        )),
        /// Wills published.
        pub wills_published: u64 = CounterDef::NEW.sys("wills/published").prom(Family::new(
            "zerofan_wills_published_total",
            "Will messages published.",
        )),
        /// Messages copied out of their read buffer before being kept for long
        /// (retained, offline queues), so they do not pin a large buffer.
        pub compactions: u64 = CounterDef::NEW.sys("messages/compactions").prom(Family::new(
            "zerofan_compactions_total",
            "Messages copied out of their read buffer before being kept for long.",
        )),
        /// Durable store operations or commits that failed.
        pub store_errors: u64 = CounterDef::NEW.sys("store/errors").prom(Family::new(
            "zerofan_store_errors_total",
            "Store operations that failed.",
        )),
        /// Store records skipped at restart because they could not be restored.
        pub store_restore_skipped: u64 = CounterDef::NEW
            .sys("store/restore_skipped")
            .prom(Family::new(
                "zerofan_store_restore_skipped_total",
                "Records skipped while restoring from the store.",
            )),
        /// Torn or corrupt log tails cut back at startup (0 or 1 per start).
        pub store_torn_tails: u64 = CounterDef::NEW.sys("store/torn_tails").prom(Family::new(
            "zerofan_store_torn_tails_total",
            "Torn or corrupt log tails cut off when the store was opened.",
        )),
        /// Bytes cut off the log at startup.
        pub store_truncated_bytes: u64 = CounterDef::NEW
            .sys("store/truncated_bytes")
            .prom(Family::new(
                "zerofan_store_truncated_bytes_total",
                "Bytes of torn or corrupt tail cut off when the store was opened.",
            )),
        /// Refusals by authentication, access control and limits.
        pub security: super::limits::SecurityMetrics = CounterDef::NEW,
    }
}

impl Metrics {
    /// Every message dropped for any reason.
    pub fn dropped_total(&self) -> u64 {
        let mut total = 0;
        self.each(&mut |def, values| {
            if def.sum == Sum::Dropped {
                total += values.iter().sum::<u64>();
            }
        });
        total
    }
}

/// Figures only the shell knows (bytes on sockets, pool), handed to the core
/// for `$SYS/`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShellStats {
    /// Bytes read from sockets.
    pub bytes_received: u64,
    /// Bytes written to sockets.
    pub bytes_sent: u64,
    /// Pool: buffer requests.
    pub pool_gets: u64,
    /// Pool: requests served from the pool.
    pub pool_hits: u64,
    /// Pool: requests that allocated.
    pub pool_misses: u64,
    /// Pool: buffers returned.
    pub pool_returns: u64,
    /// Pool: buffers freed instead of kept.
    pub pool_discards: u64,
    /// Pool: bytes held for reuse.
    pub pool_bytes_retained: u64,
    /// Pool: bytes handed out and not yet back.
    pub pool_bytes_outstanding: u64,
    /// Pool: hits / gets.
    pub pool_hit_rate: f64,
    /// Connections parked now (quiet, no task of their own).
    pub connections_parked: u64,
    /// Times a connection was parked since start.
    pub connection_parks: u64,
    /// Messages written to other cluster nodes (one per destination).
    pub cluster_forwarded_messages: u64,
    /// Bytes written to other cluster nodes.
    pub cluster_forwarded_bytes: u64,
    /// Bytes read from other cluster nodes.
    pub cluster_received_bytes: u64,
    /// Messages for other nodes dropped because a link's queue overflowed.
    pub cluster_dropped_messages: u64,
    /// Other frames dropped from an away node's overflowing link queue:
    /// replica operations, and state a later frame sets anew.
    pub cluster_shed_frames: u64,
    /// Links to other nodes (re)connected.
    pub cluster_link_connects: u64,
    /// Frames written to other cluster nodes.
    pub cluster_frames_sent: u64,
    /// Frames read from other cluster nodes.
    pub cluster_frames_received: u64,
    /// Dials of another node that failed.
    pub cluster_dial_failures: u64,
    /// Links closed for a frame that could not be read, or refused (from
    /// a node that is not a member).
    pub cluster_bad_frames: u64,
    /// Members of this node's cluster (0: not a cluster node).
    pub cluster_members: u64,
    /// Raft leader changes this node saw.
    pub cluster_leader_changes: u64,
    /// Log entries the furthest follower is behind (on the leader only).
    pub cluster_replication_lag: u64,
    /// Client-id claims the cluster's log applied.
    pub cluster_claims: u64,
    /// Node-to-node connections refused for their TLS handshake (no
    /// certificate, one from another CA, not TLS).
    pub cluster_tls_refused: u64,
    /// Times this node's ownership lease ran out.
    pub cluster_lease_expiries: u64,
    /// Client ids this node, leading, handed from a member whose lease ran
    /// out to a live one.
    pub cluster_lost_handed: u64,
    /// Images of other nodes' persistent sessions kept here.
    pub cluster_replica_images: u64,
    /// Message bytes (topic and payload) those images hold.
    pub cluster_replica_bytes: u64,
    /// Shards whose listeners began to serve before every shard had applied
    /// the subscriptions the others restored from the store (they waited
    /// the most they do, 5 s).
    pub shard_start_timeouts: u64,
}

impl ShellStats {
    /// Add another shard's figures (each shard has its own pool).
    pub fn add(&mut self, o: &ShellStats) {
        self.bytes_received += o.bytes_received;
        self.bytes_sent += o.bytes_sent;
        self.pool_gets += o.pool_gets;
        self.pool_hits += o.pool_hits;
        self.pool_misses += o.pool_misses;
        self.pool_returns += o.pool_returns;
        self.pool_discards += o.pool_discards;
        self.pool_bytes_retained += o.pool_bytes_retained;
        self.pool_bytes_outstanding += o.pool_bytes_outstanding;
        self.pool_hit_rate = if self.pool_gets == 0 {
            0.0
        } else {
            self.pool_hits as f64 / self.pool_gets as f64
        };
        self.connections_parked += o.connections_parked;
        self.connection_parks += o.connection_parks;
        self.cluster_forwarded_messages += o.cluster_forwarded_messages;
        self.cluster_forwarded_bytes += o.cluster_forwarded_bytes;
        self.cluster_received_bytes += o.cluster_received_bytes;
        self.cluster_dropped_messages += o.cluster_dropped_messages;
        self.cluster_shed_frames += o.cluster_shed_frames;
        self.cluster_link_connects += o.cluster_link_connects;
        self.cluster_frames_sent += o.cluster_frames_sent;
        self.cluster_frames_received += o.cluster_frames_received;
        self.cluster_dial_failures += o.cluster_dial_failures;
        self.cluster_bad_frames += o.cluster_bad_frames;
        self.cluster_members = self.cluster_members.max(o.cluster_members);
        self.cluster_leader_changes += o.cluster_leader_changes;
        self.cluster_replication_lag = self.cluster_replication_lag.max(o.cluster_replication_lag);
        self.cluster_claims += o.cluster_claims;
        self.cluster_tls_refused += o.cluster_tls_refused;
        self.cluster_lease_expiries += o.cluster_lease_expiries;
        self.cluster_replica_images += o.cluster_replica_images;
        self.cluster_replica_bytes += o.cluster_replica_bytes;
        self.shard_start_timeouts += o.shard_start_timeouts;
    }
}
