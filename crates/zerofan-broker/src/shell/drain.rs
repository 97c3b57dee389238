//! A cluster node about to be removed drains (see `core/drain.rs` and
//! `zerofan_cluster`'s drain): the core sends its clients to the named
//! node, then this task waits, bounded by the order's deadline, until no
//! session is left here (each taken over by the node its client went to),
//! and answers with what happened. The sessions still here are then given
//! to that node by the leader, which serves them from its copies
//! ([`adopt_loop`]).

use super::state::Shared;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use zerofan_cluster::{DrainOrder, DrainReport};

/// How often the sessions left are counted while draining: a drain lasts
/// seconds, and the count is cheap.
const CHECK_EVERY: Duration = Duration::from_millis(50);
/// Once no client is connected here, the sessions left wait this long for
/// their clients to connect elsewhere; then the leader hands them over.
const GRACE: Duration = Duration::from_secs(1);

pub(super) async fn drain_loop(shared: Rc<Shared>, mut orders: mpsc::Receiver<DrainOrder>) {
    while let Some(order) = orders.recv().await {
        let deadline = tokio::time::Instant::now() + order.deadline;
        let before = shared.broker.borrow().drain_told();
        shared
            .broker
            .borrow_mut()
            .drain(Instant::now(), order.reference.as_deref());
        shared.dispatch();
        tracing::warn!(reference = ?order.reference, deadline = ?order.deadline,
            "this node is being removed from the cluster: clients sent elsewhere");
        let grace = tokio::time::Instant::now() + GRACE.min(order.deadline);
        loop {
            let (left, _) = shared.broker.borrow().drain_progress();
            let now = tokio::time::Instant::now();
            let offline = shared.broker.borrow().connected_clients() == 0;
            if left == 0 || now >= deadline || (offline && now >= grace) {
                break;
            }
            tokio::time::sleep(CHECK_EVERY.min(deadline - tokio::time::Instant::now())).await;
        }
        let b = shared.broker.borrow();
        let (left, moved) = b.drain_progress();
        let report = DrainReport {
            clients_told: b.drain_told() - before,
            sessions_moved: moved,
            sessions_left: left as u64,
        };
        tracing::info!(
            clients_told = report.clients_told,
            sessions_moved = moved,
            sessions_left = left,
            "drained"
        );
        // The leader may have given up waiting: nothing to do then.
        let _ = order.reply.send(report);
    }
}

/// Serve the client ids the leader gave this node from a node being
/// removed, each from its copy here once that node handed it over (see
/// `Broker::awaits_drained_handover`), each in a task of its own so that
/// one slow handover does not hold up the others.
pub(super) async fn adopt_loop(shared: Rc<Shared>, mut ids: mpsc::Receiver<String>) {
    while let Some(id) = ids.recv().await {
        let shared = shared.clone();
        tokio::task::spawn_local(async move {
            let waits = |b: &crate::core::Broker| b.awaits_drained_handover(&id);
            if !super::claims::wait_until_not(&shared, waits).await {
                tracing::debug!(client_id = %id, "no handover from the drained node in time");
            }
            // The claim that gave it here, once applied here (it fences
            // the session's replicated changes; see `core::replica`).
            let epoch = shared
                .cluster
                .get()
                .and_then(|c| c.owner(&id).filter(|(o, _)| *o == c.node_id()))
                .map_or(0, |(_, e)| e);
            let adopted = shared
                .broker
                .borrow_mut()
                .adopt_drained(Instant::now(), &id, epoch);
            tracing::debug!(client_id = %id, adopted, "client id handed over");
            shared.dispatch();
        });
    }
}
