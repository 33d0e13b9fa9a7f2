//! The same groups on a real Redis, through the fault proxy, in real time.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tollgate::RedisBackend;
use tollgate_simulator::{FaultKind, FaultSwitch, Report, SimulationError};
use tollgate_testkit::proxy::{Fault, FaultProxy};

use super::{Options, RedisUrl};

/// Switches the proxy's fault, and tells the operator (on stderr).
#[derive(Debug)]
struct ProxySwitch {
    proxy: Arc<FaultProxy>,
    slow_by: Duration,
}

impl FaultSwitch for ProxySwitch {
    fn set(
        &self,
        fault: Option<FaultKind>,
    ) -> Pin<Box<dyn Future<Output = Result<(), SimulationError>> + Send + '_>> {
        eprintln!(
            "simulate: {}",
            if fault.is_some() {
                "the store fails now"
            } else {
                "the store is back"
            }
        );
        let proxy = self.proxy.clone();
        let fault = match fault {
            Some(FaultKind::Refuse) => Fault::Refuse,
            Some(FaultKind::Blackhole) => Fault::Blackhole,
            Some(_) => Fault::Delay(self.slow_by),
            None => Fault::Pass,
        };
        Box::pin(async move {
            tokio::task::spawn_blocking(move || proxy.set(fault))
                .await
                .map_err(|e| SimulationError::FaultSwitch(e.to_string()))
        })
    }
}

/// Starts the proxy in front of `target`, connects every instance through it, and
/// runs the scenario.
pub(super) async fn run(options: &Options, target: &RedisUrl) -> Result<Report, String> {
    let scenario = &options.scenario;
    let proxy = Arc::new(FaultProxy::start(target.port));
    let proxied = format!(
        "redis://{}127.0.0.1:{}{}",
        target.userinfo,
        proxy.port(),
        target.path
    );
    // Fresh keys for every run, apart for every group.
    let run = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let mut stores: Vec<Vec<RedisBackend>> = Vec::new();
    for (name, instances) in scenario
        .group_names()
        .iter()
        .zip(scenario.group_instances())
    {
        let mut group = Vec::new();
        for _ in 0..instances {
            let store = RedisBackend::builder(proxied.clone())
                .prefix(format!("tollgate-sim-{}-{run}-{name}", std::process::id()))
                .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(100))
                .build()
                .map_err(|e| format!("--redis: {e}"))?;
            store.ping().await.map_err(|e| {
                format!(
                    "cannot reach Redis at {} (through the fault proxy): {e}",
                    target.url
                )
            })?;
            group.push(store);
        }
        stores.push(group);
    }
    let switch = ProxySwitch {
        proxy,
        slow_by: Duration::from_millis(scenario.store_timeout_ms_value() * 2),
    };
    eprintln!(
        "simulate: running {} s in real time against {}",
        scenario.total_secs(),
        target.url
    );
    scenario
        .run_against(|g, i| stores[g][i].clone(), &switch)
        .await
        .map_err(|e| e.to_string())
}
