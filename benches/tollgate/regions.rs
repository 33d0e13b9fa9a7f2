//! Group `regions`: one limit across three regions on the two-tier store, a redis-server per
//! region and a global one behind a fault proxy per region adding 80 ms each way, two
//! instances per region. What a decision costs: the WAN calls per request of a hot caller
//! within its limit, and the calls to the region's own Redis per request; and the limit
//! kept under overload by all regions together.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tollgate::store::TwoTierBackend;
use tollgate::{Caller, Limiter, Policy, Quota, RedisBackend};
use tollgate_testkit::proxy::{Fault, FaultProxy};
use tollgate_testkit::rates::unix_millis;
use tollgate_testkit::redis::RedisServer;

use crate::report::{Row, write_rows};
use crate::support::{SLOW_TEST_MACHINE, multi_thread_runtime, scripts_run, wanted};

const GROUP: &str = "regions";
const WAN_RTT: Duration = Duration::from_millis(160);
const SPREAD: [f64; 3] = [0.80, 0.15, 0.05];
const RUN: Duration = Duration::from_secs(8);

struct Region {
    redis: RedisServer,
    _wan: FaultProxy,
    stores: Vec<TwoTierBackend>,
    limiters: Vec<Limiter>,
}

fn region(name: &str, global: &RedisServer, quota: Quota) -> Region {
    let redis = RedisServer::start();
    let wan = FaultProxy::start(global.port());
    wan.set(Fault::Delay(WAN_RTT));
    let (mut stores, mut limiters) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        let connect = |url: String| {
            RedisBackend::builder(url)
                .response_timeout(SLOW_TEST_MACHINE)
                .build()
                .expect("backend")
        };
        let store = TwoTierBackend::builder(name, connect(redis.url()), connect(wan.url()))
            .wan_rtt(WAN_RTT)
            .build()
            .expect("a region");
        limiters.push(
            Limiter::builder()
                .name("regions")
                .backend(store.clone())
                .store_timeout(SLOW_TEST_MACHINE)
                .policy(Policy::sliding_window("quota", quota))
                .build(),
        );
        stores.push(store);
    }
    Region {
        redis,
        _wan: wan,
        stores,
        limiters,
    }
}

/// What a run saw in each region: decisions as (unix ms, admitted), WAN calls, and scripts
/// run by the region's Redis.
struct Seen {
    decisions: Vec<Vec<(u64, bool)>>,
    wan_calls: Vec<u64>,
    regional_calls: Vec<u64>,
}

/// Three regions, acme sending `rate` a second 80/15/5 against `quota` for `RUN`.
async fn run(quota: Quota, rate: f64) -> Seen {
    let global = RedisServer::start();
    let regions: Arc<Vec<Region>> = Arc::new(
        ["us-east", "eu-west", "ap-south"]
            .iter()
            .map(|name| region(name, &global, quota))
            .collect(),
    );
    let before: Vec<u64> = regions.iter().map(|r| scripts_run(&r.redis)).collect();
    let end = unix_millis() + RUN.as_millis() as u64;
    let senders: Vec<_> = (0..regions.len())
        .map(|index| {
            let regions = Arc::clone(&regions);
            tokio::spawn(async move {
                let log = Arc::new(Mutex::new(Vec::new()));
                let mut tick =
                    tokio::time::interval(Duration::from_secs_f64(1.0 / (rate * SPREAD[index])));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                let mut tasks = Vec::new();
                let mut next = 0;
                while unix_millis() < end {
                    tick.tick().await;
                    let limiter = regions[index].limiters[next % 2].clone();
                    next += 1;
                    let log = Arc::clone(&log);
                    tasks.push(tokio::spawn(async move {
                        let allowed = limiter.check(&Caller::new("acme")).await.is_allowed();
                        log.lock().unwrap().push((unix_millis(), allowed));
                    }));
                }
                for task in tasks {
                    task.await.expect("a decision");
                }
                std::mem::take(&mut *log.lock().unwrap())
            })
        })
        .collect();
    let mut decisions = Vec::new();
    for sender in senders {
        decisions.push(sender.await.expect("a sender"));
    }
    Seen {
        wan_calls: regions
            .iter()
            .map(|r| r.stores.iter().map(TwoTierBackend::wan_calls).sum())
            .collect(),
        regional_calls: regions
            .iter()
            .zip(before)
            .map(|(r, before)| scripts_run(&r.redis) - before)
            .collect(),
        decisions,
    }
}

pub(crate) fn bench(_: &mut criterion::Criterion) {
    if !wanted(GROUP) {
        return;
    }
    let runtime = multi_thread_runtime(2);
    let mut rows = Vec::new();

    // A hot caller within its limit: 100 a second against 10,000 a minute.
    let hot = runtime.block_on(run(Quota::per_minute(10_000), 100.0));
    let per_request = |calls: u64, region: usize| calls as f64 / hot.decisions[region].len() as f64;
    let wan = per_request(hot.wan_calls[0], 0);
    rows.push((
        "regions/wan_calls",
        Row::new(
            "Two-tier store, three regions 80 ms each way from the global Redis: WAN calls per request of a hot caller in its busiest region (80 of its 100 req/s, within 10,000 a minute, 8 s)",
            format!("{wan:.3}"),
        )
        .peer(format!(
            "the quieter regions (15 and 5 req/s): {:.3} and {:.3}; one Redis across regions: 1",
            per_request(hot.wan_calls[1], 1),
            per_request(hot.wan_calls[2], 2)
        ))
        .target("≤ 0.05", wan <= 0.05),
    ));
    let regional = per_request(hot.regional_calls[0], 0);
    rows.push((
        "regions/regional_calls",
        Row::new(
            "Two-tier store, same run: calls to the region's own Redis per request in the busiest region (the decision, and writing back each WAN call's answer)",
            format!("{regional:.3}"),
        )
        .peer(format!("1 decision + {wan:.3} answers written back"))
        .target("≤ 1.05", regional <= 1.05),
    ));

    // Overload: the running example's acme at 2.4 times its limit.
    let over = runtime.block_on(run(Quota::per_second(50), 120.0));
    let mut admitted: Vec<u64> = over
        .decisions
        .iter()
        .flatten()
        .filter(|(_, allowed)| *allowed)
        .map(|(at, _)| *at)
        .collect();
    admitted.sort_unstable();
    // Whole seconds of the limit's window after the first two (the first leases).
    let first = admitted.first().copied().unwrap_or(0) / 1_000 * 1_000 + 2_000;
    let last = admitted.last().copied().unwrap_or(0) / 1_000 * 1_000;
    let per_second: Vec<usize> = (first..last)
        .step_by(1_000)
        .map(|s| {
            admitted
                .iter()
                .filter(|t| (s..s + 1_000).contains(*t))
                .count()
        })
        .collect();
    let most = per_second.iter().copied().max().unwrap_or(0);
    let mean = per_second.iter().sum::<usize>() as f64 / per_second.len().max(1) as f64;
    let requests: usize = over.decisions.iter().map(Vec::len).sum();
    let calls: u64 = over.wan_calls.iter().sum();
    rows.push((
        "regions/overload",
        Row::new(
            "Two-tier store, acme at 2.4x its limit (120 req/s vs 50/s, 80/15/5 over the three regions, 8 s): admitted by all regions together in a second of the limit's window",
            format!("at most {most} of 50 (mean {mean:.1})"),
        )
        .peer(format!(
            "each region counting alone: 50 + 18 + 6 = 74; WAN calls per request {:.3}",
            calls as f64 / requests as f64
        ))
        .target("≤ 50", most <= 50),
    ));
    write_rows("regions.tsv", &rows);
}
