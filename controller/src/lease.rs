//! Leader election: a `coordination.k8s.io` Lease, through
//! kube-lease-manager. Every replica serves every function; only the
//! Lease's holder writes Services, status and Events.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tokio::sync::{Notify, mpsc, watch};

use crate::{Config, FIELD_MANAGER};

/// How long a Lease is held without renewal, and how long before its end
/// the holder renews it.
const LEASE_SECONDS: u64 = 15;
const LEASE_GRACE_SECONDS: u64 = 5;

/// Joins the election of the Lease; `tx` says whether this replica leads, and `on_change` is sent to at each change (the controller then
/// reconciles every Function: what the leader writes changes hands).
/// Notifying the `Notify` releases the Lease and ends the task.
pub(crate) async fn elect(
    client: &Client,
    config: &Config,
    tx: watch::Sender<bool>,
    on_change: &mpsc::UnboundedSender<()>,
) -> anyhow::Result<(Arc<Notify>, tokio::task::JoinHandle<()>)> {
    use anyhow::Context as _;
    let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &config.lease)
        .with_namespace(&config.namespace)
        .with_identity(&config.identity)
        .with_duration(LEASE_SECONDS)
        .with_grace(LEASE_GRACE_SECONDS)
        .with_field_manager(FIELD_MANAGER)
        .build()
        .await
        .with_context(|| format!("the Lease {}/{}", config.namespace, config.lease))?;
    tracing::info!(
        identity = config.identity,
        lease = format!("{}/{}", config.namespace, config.lease),
        "leader election: serving every function; the Lease's holder writes"
    );
    let stop = Arc::new(Notify::new());
    let stopped = stop.clone();
    let on_change = on_change.clone();
    let identity = config.identity.clone();
    let task = tokio::spawn(async move {
        loop {
            tokio::select! {
                changed = manager.changed() => match changed {
                    Ok(leading) => {
                        tracing::info!(identity, leading, "leader election: {}", if leading {
                            "this replica leads: it writes Services and status"
                        } else {
                            "another replica leads"
                        });
                        let _ = tx.send(leading);
                        let _ = on_change.send(());
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "leader election: cannot reach the Lease; retrying");
                        tokio::time::sleep(Duration::from_secs(2)).await;
                    }
                },
                () = stopped.notified() => {
                    if *tx.borrow() && let Err(e) = manager.release().await {
                        tracing::warn!(error = %e, "cannot release the Lease");
                    }
                    return;
                }
            }
        }
    });
    Ok((stop, task))
}
