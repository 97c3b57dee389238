//! A cluster node about to be removed drains (see `core/drain.rs` and
//! `zerofan_cluster`'s drain): the core sends its clients to the named
//! node, then this task waits, bounded by the order's deadline, until no
//! session is left here (each taken over by the node its client went to),
//! and answers with what happened.

use super::state::Shared;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use zerofan_cluster::{DrainOrder, DrainReport};

/// How often the sessions left are counted while draining: a drain lasts
/// seconds, and the count is cheap.
const CHECK_EVERY: Duration = Duration::from_millis(50);

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
        loop {
            let (left, _) = shared.broker.borrow().drain_progress();
            if left == 0 || tokio::time::Instant::now() >= deadline {
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
