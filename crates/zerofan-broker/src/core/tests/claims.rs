//! Client ids in a cluster (`core/claims.rs`): a CONNECT waits for the
//! shell's claim after its login; a refused claim is 0x88; a newer claim
//! elsewhere ends the session here with 0x8E.

use super::*;
use crate::core::ClaimRequest;

fn claims(h: &mut H) -> Vec<ClaimRequest> {
    let mut out = Vec::new();
    h.b.take_claims(&mut out);
    out
}

#[test]
fn connect_waits_for_its_claim() {
    let mut h = H::new();
    h.b.set_claims(true);
    let (c, out) = h.connect_with("dev", Protocol::V5, true, |_| {});
    assert!(out.connack().is_none(), "CONNACK before the claim");
    assert!(h.b.has_claims());
    let asked = claims(&mut h);
    assert_eq!(
        asked,
        [ClaimRequest {
            conn: c,
            client_id: "dev".into(),
            clean_start: true,
        }]
    );
    assert!(!h.b.has_claims());
    h.b.claim_answered(h.now, c, true);
    assert_eq!(h.out(c).connack().unwrap().reason, ReasonCode::SUCCESS);
    // A claimed connection works as usual.
    h.subscribe(c, "t", opts(QoS::AtMostOnce));
    let p = h.client_no_claim("pub");
    h.send(p, Packet::Publish(publish("t", "x", QoS::AtMostOnce, 0)));
    assert_eq!(h.out(c).payloads(), ["x"]);
}

#[test]
fn a_refused_claim_is_server_unavailable() {
    let mut h = H::new();
    h.b.set_claims(true);
    for protocol in [Protocol::V5, Protocol::V311] {
        let (c, _) = h.connect_with("dev", protocol, true, |_| {});
        assert_eq!(claims(&mut h).len(), 1);
        h.b.claim_answered(h.now, c, false);
        let out = h.out(c);
        assert_eq!(
            out.connack().unwrap().reason,
            ReasonCode::SERVER_UNAVAILABLE
        );
        assert!(out.closed);
    }
    assert_eq!(h.b.metrics().claims_refused, 2);
}

#[test]
fn no_claim_without_a_cluster_or_a_client_id() {
    let mut h = H::new();
    let (c, out) = h.connect_with("dev", Protocol::V5, true, |_| {});
    assert_eq!(out.connack().unwrap().reason, ReasonCode::SUCCESS);
    assert!(claims(&mut h).is_empty());
    h.b.set_claims(true);
    let (_, out) = h.connect_with("", Protocol::V5, true, |_| {});
    assert_eq!(out.connack().unwrap().reason, ReasonCode::SUCCESS);
    assert!(claims(&mut h).is_empty());
    // An answer for a connection that is gone, or that never asked, is
    // ignored.
    h.b.claim_answered(h.now, c, true);
    let (w, _) = h.connect_with("late", Protocol::V5, true, |_| {});
    h.b.connection_lost(h.now, w);
    h.b.claim_answered(h.now, w, true);
    assert!(h.out(w).connack().is_none());
}

#[test]
fn a_login_that_fails_claims_nothing() {
    let mut h = H::new();
    let mut p = zerofan_auth::PasswordFile::new();
    p.set_with_iterations("alice", b"wonderland", 10).unwrap();
    h.b.set_security(crate::core::SecurityConfig {
        listeners: vec![crate::core::ListenerAuth {
            allow_anonymous: false,
            passwords: Some(std::sync::Arc::new(p)),
            ..Default::default()
        }],
        throttle: Default::default(),
        jwt: None,
        http: None,
    });
    h.b.set_claims(true);
    let (c, out) = h.connect_with("victim", Protocol::V5, true, |c| {
        c.username = Some(s("alice"));
        c.password = Some(Bytes::from_static(b"guess"));
    });
    assert_eq!(
        out.connack().unwrap().reason,
        ReasonCode::BAD_USER_NAME_OR_PASSWORD
    );
    assert!(claims(&mut h).is_empty(), "claimed for {c}");
}

#[test]
fn a_newer_claim_elsewhere_ends_the_session_here() {
    let mut h = H::new();
    h.b.set_claims(true);
    let (c, _) = h.connect_with("dev", Protocol::V5, false, |c| {
        c.properties.session_expiry_interval = Some(3600);
    });
    claims(&mut h);
    h.b.claim_answered(h.now, c, true);
    h.subscribe(c, "t", opts(QoS::AtLeastOnce));
    h.out(c);
    h.b.client_taken(h.now, "dev");
    let out = h.out(c);
    assert_eq!(out.disconnect(), Some(ReasonCode::SESSION_TAKEN_OVER));
    assert!(out.closed);
    assert_eq!(h.b.metrics().fenced_takeovers, 1);
    // The session left with it: coming back here starts a new one.
    let (c2, _) = h.connect_with("dev", Protocol::V5, false, |c| {
        c.properties.session_expiry_interval = Some(3600);
    });
    claims(&mut h);
    h.b.claim_answered(h.now, c2, true);
    assert!(!h.out(c2).connack().unwrap().session_present);
    // Unknown ids are ignored.
    h.b.client_taken(h.now, "nobody");
    assert_eq!(h.b.metrics().fenced_takeovers, 1);
}

impl H {
    /// A v5 client on a core that claims: connect and grant at once.
    fn client_no_claim(&mut self, id: &str) -> ConnId {
        let (c, _) = self.connect_with(id, Protocol::V5, true, |_| {});
        let mut out = Vec::new();
        self.b.take_claims(&mut out);
        self.b.claim_answered(self.now, c, true);
        c
    }
}

#[test]
fn a_lost_lease_drops_claimed_clients_and_refuses_connects_until_renewed() {
    let mut h = H::new();
    h.b.set_claims(true);
    let mut claimed = Vec::new();
    for (id, protocol) in [("v5", Protocol::V5), ("v3", Protocol::V311)] {
        let (c, _) = h.connect_with(id, protocol, true, |_| {});
        claims(&mut h);
        h.b.claim_answered(h.now, c, true);
        h.out(c);
        claimed.push(c);
    }
    // An empty client id gets a fresh one, claimed by nobody: it stays.
    let (fresh, _) = h.connect_with("", Protocol::V5, true, |_| {});
    h.out(fresh);
    h.b.cluster_lease(h.now, true);
    assert!(!h.out(claimed[0]).closed, "a held lease changes nothing");

    h.b.cluster_lease(h.now, false);
    let v5 = h.out(claimed[0]);
    assert_eq!(v5.disconnect(), Some(ReasonCode::USE_ANOTHER_SERVER));
    assert!(v5.closed);
    let v3 = h.out(claimed[1]);
    assert_eq!(v3.disconnect(), None, "3.1.1 has no DISCONNECT to send");
    assert!(v3.closed);
    assert!(!h.out(fresh).closed);
    assert_eq!(h.b.metrics().clients_fenced, 2);
    // Lost again (no change): nothing more.
    h.b.cluster_lease(h.now, false);
    assert_eq!(h.b.metrics().clients_fenced, 2);

    // Refused at once, both protocols, without asking the cluster.
    for protocol in [Protocol::V5, Protocol::V311] {
        let (_, out) = h.connect_with("v5", protocol, true, |_| {});
        assert!(claims(&mut h).is_empty());
        assert_eq!(
            out.connack().unwrap().reason,
            ReasonCode::SERVER_UNAVAILABLE
        );
        assert!(out.closed);
    }
    // Renewed: CONNECTs claim their client id again.
    h.b.cluster_lease(h.now, true);
    let (c, _) = h.connect_with("v5", Protocol::V5, true, |_| {});
    assert_eq!(claims(&mut h).len(), 1);
    h.b.claim_answered(h.now, c, true);
    assert_eq!(h.out(c).connack().unwrap().reason, ReasonCode::SUCCESS);
}

/// A node paused past its lease wakes up with a message for its client:
/// the first event past the lease drops the client before anything is
/// delivered, whether or not the cluster has said so yet; a renewal in
/// time serves again.
#[test]
fn nothing_is_delivered_past_the_lease_even_before_the_cluster_says_so() {
    let mut h = H::new();
    h.b.set_claims(true);
    let (c, _) = h.connect_with("sub", Protocol::V5, true, |_| {});
    claims(&mut h);
    h.b.claim_answered(h.now, c, true);
    h.out(c);
    h.subscribe(c, "t", opts(QoS::AtLeastOnce));
    let (p, _) = h.connect_with("", Protocol::V5, true, |_| {});
    h.out(p);
    h.b.cluster_lease_until(h.now, h.now, h.now + Duration::from_secs(1));
    h.send(
        p,
        Packet::Publish(publish("t", "in time", QoS::AtLeastOnce, 1)),
    );
    assert_eq!(h.out(c).payloads(), ["in time"]);

    h.now += Duration::from_secs(2);
    h.send(
        p,
        Packet::Publish(publish("t", "late", QoS::AtLeastOnce, 2)),
    );
    let out = h.out(c);
    assert_eq!(out.payloads(), Vec::<String>::new(), "past the lease");
    assert_eq!(out.disconnect(), Some(ReasonCode::USE_ANOTHER_SERVER));
    assert_eq!(h.b.metrics().clients_fenced, 1);
    let (_, out) = h.connect_with("sub", Protocol::V5, true, |_| {});
    assert_eq!(
        out.connack().unwrap().reason,
        ReasonCode::SERVER_UNAVAILABLE
    );

    // The cluster renewed it meanwhile (it never ran out there).
    h.b.cluster_lease_until(h.now, h.now, h.now + Duration::from_secs(2));
    let (c, _) = h.connect_with("sub", Protocol::V5, true, |_| {});
    assert_eq!(claims(&mut h).len(), 1);
    h.b.claim_answered(h.now, c, true);
    assert_eq!(h.out(c).connack().unwrap().reason, ReasonCode::SUCCESS);
}
