//! One limit across regions, on real redis-servers: a Redis per region and a global one
//! behind the fault proxy, 80 ms each way (160 ms a round trip), two instances per region
//! on the two-tier store. The running example's acme (50 a second) sends 120 a second,
//! 80/15/5 over three regions; the busiest is cut off from the global store for a while.
//! Admissions are counted by all regions together in each second of the limit's window
//! (aligned to the epoch, as the store's windows are) and in the worst second anywhere.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tollgate::store::TwoTierBackend;
use tollgate::{Caller, Decision, FailurePolicy, Limiter, Policy, Quota, RedisBackend};
use tollgate_testkit::proxy::{Fault, FaultProxy};
use tollgate_testkit::rates::{self, unix_millis};
use tollgate_testkit::recorder::{counter, with_recorder};
use tollgate_testkit::redis::RedisServer;

const WAN_RTT: Duration = Duration::from_millis(160);
const LIMIT: u64 = 50;
const WINDOW_MS: u64 = 1_000;
/// How each caller's requests spread over the regions, us-east first.
const SPREAD: [f64; 3] = [0.80, 0.15, 0.05];

/// A region: its Redis, its way to the global store, and its instances' limiters.
struct Region {
    name: &'static str,
    _redis: RedisServer,
    wan: FaultProxy,
    stores: Vec<TwoTierBackend>,
    limiters: Vec<Limiter>,
}

impl Region {
    fn start(name: &'static str, global: &RedisServer, quota: Quota) -> Self {
        let redis = RedisServer::start();
        let wan = FaultProxy::start(global.port());
        wan.set(Fault::Delay(WAN_RTT));
        let mut stores = Vec::new();
        let mut limiters = Vec::new();
        for _ in 0..2 {
            let regional = redis_backend(redis.url(), Duration::from_secs(2));
            let global = redis_backend(wan.url(), Duration::from_secs(2));
            let store = TwoTierBackend::builder(name, regional, global)
                .wan_rtt(WAN_RTT)
                .build()
                .expect("a valid region");
            let limiter = orders_limiter(&store, Policy::sliding_window("acme-quota", quota));
            stores.push(store);
            limiters.push(limiter);
        }
        Self {
            name,
            _redis: redis,
            wan,
            stores,
            limiters,
        }
    }

    fn wan_calls(&self) -> u64 {
        self.stores.iter().map(TwoTierBackend::wan_calls).sum()
    }
}

/// A store on the redis-server at `url`, answering within `response_timeout`.
fn redis_backend(url: String, response_timeout: Duration) -> RedisBackend {
    RedisBackend::builder(url)
        .response_timeout(response_timeout)
        .build()
        .expect("valid URL")
}

/// Waits until `ready` answers true, asking every `every`; fails saying `what` after
/// `within`.
async fn eventually(
    what: &str,
    within: Duration,
    every: Duration,
    mut ready: impl AsyncFnMut() -> bool,
) {
    let deadline = std::time::Instant::now() + within;
    while !ready().await {
        assert!(std::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(every).await;
    }
}

/// The demo's limiter on a region's store: the one policy, a second to decide.
fn orders_limiter(store: &TwoTierBackend, policy: Policy) -> Limiter {
    Limiter::builder()
        .name("orders")
        .backend(store.clone())
        .store_timeout(Duration::from_secs(1))
        .policy(policy)
        .build()
}

/// What a run saw: each region's requests, as (unix ms of the decision, admitted).
#[derive(Default)]
struct Seen {
    decisions: Vec<Vec<(u64, bool)>>,
}

impl Seen {
    /// Admissions by all regions together in each window of the limit that lies whole
    /// within `[from, to)` (unix ms).
    fn per_window(&self, from: u64, to: u64) -> Vec<usize> {
        let first = from.div_ceil(WINDOW_MS) * WINDOW_MS;
        (first..to.saturating_sub(WINDOW_MS - 1))
            .step_by(WINDOW_MS as usize)
            .map(|start| {
                self.decisions
                    .iter()
                    .flatten()
                    .filter(|(at, admitted)| *admitted && (start..start + WINDOW_MS).contains(at))
                    .count()
            })
            .collect()
    }

    /// The admissions of `regions`, as offsets from the epoch, sorted.
    fn admitted(&self, regions: impl IntoIterator<Item = usize>) -> Vec<Duration> {
        let mut admitted: Vec<Duration> = regions
            .into_iter()
            .flat_map(|region| &self.decisions[region])
            .filter(|(_, admitted)| *admitted)
            .map(|(at, _)| Duration::from_millis(*at))
            .collect();
        admitted.sort_unstable();
        admitted
    }

    /// The most admissions by all regions together in any window of the limit's length
    /// that starts in `[from, to)`.
    fn worst_window(&self, from: u64, to: u64) -> usize {
        rates::worst_window(
            &self.admitted(0..self.decisions.len()),
            Duration::from_millis(WINDOW_MS),
            Duration::from_millis(from),
            Duration::from_millis(to),
        )
    }

    /// Region `region`'s admissions per second in `[from, to)`.
    fn rate(&self, region: usize, from: u64, to: u64) -> f64 {
        rates::rate_between(
            &self.admitted([region]),
            Duration::from_millis(from),
            Duration::from_millis(to),
        )
    }

    fn requests(&self) -> usize {
        self.decisions.iter().map(Vec::len).sum()
    }
}

/// Sends `rate` requests a second for `caller` to `region`'s instances in turn, each
/// decision on its own task, until `until` (unix ms).
async fn send(
    regions: Arc<[Region; 3]>,
    region: usize,
    caller: &'static str,
    rate: f64,
    until: u64,
    seen: Arc<Mutex<Vec<(u64, bool)>>>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = Vec::new();
    let mut next = 0;
    let region = &regions[region];
    while unix_millis() < until {
        tick.tick().await;
        let limiter = region.limiters[next % region.limiters.len()].clone();
        next += 1;
        let seen = Arc::clone(&seen);
        tasks.push(tokio::spawn(async move {
            let decision = limiter.check(&Caller::new(caller)).await;
            let at = unix_millis();
            seen.lock().unwrap().push((at, decision.is_allowed()));
        }));
    }
    for task in tasks {
        task.await.expect("a decision task");
    }
}

/// A run of three regions of two instances: acme sending `rate` a second, 80/15/5, against
/// `quota`, for `total` ms, the first region cut off from the global store over `cut` (ms
/// from the start), if given.
async fn run(
    quota: Quota,
    callers: &[(&'static str, f64)],
    total: u64,
    cut: Option<(u64, u64)>,
) -> (Arc<[Region; 3]>, Vec<Seen>, u64) {
    let global = RedisServer::start();
    let regions = Arc::new([
        Region::start("us-east", &global, quota),
        Region::start("eu-west", &global, quota),
        Region::start("ap-south", &global, quota),
    ]);
    let start = unix_millis();
    let end = start + total;
    // By caller, by region.
    let logs: Vec<Vec<_>> = callers
        .iter()
        .map(|_| {
            regions
                .iter()
                .map(|_| Arc::new(Mutex::new(Vec::new())))
                .collect()
        })
        .collect();
    let mut senders = Vec::new();
    for (&(caller, rate), logs) in callers.iter().zip(&logs) {
        for region in 0..regions.len() {
            let sent = send(
                Arc::clone(&regions),
                region,
                caller,
                rate * SPREAD[region],
                end,
                Arc::clone(&logs[region]),
            );
            senders.push(tokio::spawn(sent));
        }
    }
    if let Some((from, to)) = cut {
        tokio::time::sleep(Duration::from_millis(
            (start + from).saturating_sub(unix_millis()),
        ))
        .await;
        regions[0].wan.set(Fault::Blackhole);
        tokio::time::sleep(Duration::from_millis(
            (start + to).saturating_sub(unix_millis()),
        ))
        .await;
        regions[0].wan.set(Fault::Delay(WAN_RTT));
    }
    for sender in senders {
        sender.await.expect("a sender");
    }
    let seen = logs
        .iter()
        .map(|logs| Seen {
            decisions: logs
                .iter()
                .map(|log| std::mem::take(&mut *log.lock().unwrap()))
                .collect(),
        })
        .collect();
    drop(global);
    (regions, seen, start)
}

/// WAN calls per request of every caller, by region.
fn wan_calls_per_request(regions: &[Region], seen: &[Seen]) -> Vec<f64> {
    regions
        .iter()
        .enumerate()
        .map(|(index, region)| {
            let requests: usize = seen.iter().map(|s| s.decisions[index].len()).sum();
            region.wan_calls() as f64 / requests.max(1) as f64
        })
        .collect()
}

/// The running example across three regions: acme at 2.4x its limit of 50 a second and
/// globex at 20 a second, each 80/15/5 over the regions, us-east cut off from the global
/// store from 8 s to 16 s, the run ending at 24 s. For neither customer, in no second of
/// the limit's window, do the regions together admit more than 50; globex, within its
/// limit, is admitted in every region.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_regions_keep_one_limit_through_a_partition() {
    let (cut, back, end) = (8_000, 16_000, 24_000);
    let callers = [("acme", 120.0), ("globex", 20.0)];
    let (regions, seen, start) =
        run(Quota::per_second(LIMIT), &callers, end, Some((cut, back))).await;
    let phases = [
        ("normal", start + 2_000, start + cut),
        ("partition", start + cut, start + back),
        ("recovery", start + back, start + end),
    ];
    for ((caller, _), seen) in callers.iter().zip(&seen) {
        for (phase, from, to) in phases {
            let windows = seen.per_window(from, to);
            let worst = seen.worst_window(from, to.saturating_sub(WINDOW_MS));
            let rates: Vec<String> = regions
                .iter()
                .enumerate()
                .map(|(i, region)| format!("{} {:.1}/s", region.name, seen.rate(i, from, to)))
                .collect();
            println!(
                "{caller} {phase}: per second {windows:?}, worst second {worst}, {}",
                rates.join(", ")
            );
            assert!(
                windows.iter().all(|&n| n as u64 <= LIMIT),
                "{caller} {phase}: a second of the limit's window admitted more than {LIMIT}: {windows:?}"
            );
        }
    }
    // globex, well within its limit, is admitted wherever it calls once its first leases
    // have come: in ap-south, one request a second, each lease outlives the second it was
    // counted in and is spent in the next. A refill there that meets the room kept for
    // us-east's share (40 of 50, by demand) and for its units held over the window's start
    // comes back empty, and is asked again a little later; one in time for the region's
    // next request usually, not always. Measured: 19 or 20 a second together; alone,
    // eu-west 2.2 to 3 of its 3, ap-south 0.8 to 1 of its 1; beside other tests (as CI
    // runs it), eu-west down to 2.0.
    let linked = [(start + 4_000, start + cut), (start + back, start + end)];
    for (from, to) in linked {
        let together: f64 = (0..regions.len()).map(|i| seen[1].rate(i, from, to)).sum();
        assert!(together >= 0.85 * 20.0, "globex: {together:.1}/s of 20/s");
        for (index, (region, share)) in regions.iter().zip(SPREAD).enumerate() {
            let admitted = seen[1].rate(index, from, to);
            assert!(
                admitted >= 0.5 * 20.0 * share,
                "globex in {}: {admitted:.1}/s of {:.1}/s",
                region.name,
                20.0 * share
            );
        }
    }
    // Cut off, us-east admitted acme's requests on its share all through the partition.
    let partition = seen[0].rate(0, start + cut + 1_000, start + back);
    assert!(partition > 10.0, "us-east on its share: {partition:.1}/s");
    let calls: u64 = regions.iter().map(Region::wan_calls).sum();
    let requests: usize = seen.iter().map(Seen::requests).sum();
    println!(
        "WAN calls per request: {:.3} ({calls} for {requests}), by region {:.3?}",
        calls as f64 / requests as f64,
        wan_calls_per_request(&*regions, &seen)
    );
}

/// A hot caller within its limit (100 a second against 10,000 a minute, 80 of them in
/// us-east): every decision is one regional round trip, and us-east calls the global store
/// for a few of its requests in a hundred.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_caller_costs_few_wan_calls() {
    let (regions, seen, start) =
        run(Quota::per_minute(10_000), &[("acme", 100.0)], 10_000, None).await;
    let by_region = wan_calls_per_request(&*regions, &seen);
    let seen = &seen[0];
    let refused: Vec<usize> = seen
        .decisions
        .iter()
        .map(|d| d.iter().filter(|(_, admitted)| !admitted).count())
        .collect();
    println!(
        "WAN calls per request by region: {by_region:.3?}; refused by region {refused:?} of {}",
        seen.requests()
    );
    // A hot region's leases cover a round trip and a horizon of its demand: 80 a second
    // for 360 ms, a call for every 29 requests. The bound leaves room for a busy machine.
    assert!(by_region[0] <= 0.1, "us-east: {:.3}", by_region[0]);
    // Within its limit, a caller is refused only until its first leases come, two round
    // trips at the start (the first call also caches the script at the global store).
    let late: Vec<u64> = seen
        .decisions
        .iter()
        .flatten()
        .filter(|(at, admitted)| !admitted && *at >= start + 2_000)
        .map(|(at, _)| at - start)
        .collect();
    assert!(
        late.is_empty(),
        "refused after the start, at (ms): {late:?}"
    );
}

/// The region's own Redis lost: the limiter's failure policy answers, as for any store
/// (here failing closed); back, the region decides on its leases again. And a policy the
/// two-tier store does not decide (a token bucket) is a store error, which the failure
/// policy answers too, never an admission the global store did not count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_regions_own_redis_lost_meets_the_failure_policy() {
    let global = RedisServer::start();
    let mut regional = RedisServer::start();
    let store = || {
        let connect = |url: String| redis_backend(url, Duration::from_secs(2));
        TwoTierBackend::builder("us-east", connect(regional.url()), connect(global.url()))
            .build()
            .expect("a valid region")
    };
    let limiter = |policy: Policy| {
        Limiter::builder()
            .name("orders")
            .backend(store())
            .store_timeout(Duration::from_secs(1))
            .policy(policy)
            .on_store_failure(FailurePolicy::closed())
            .build()
    };
    let windowed = limiter(Policy::sliding_window("per-minute", Quota::per_minute(600)));
    let bucket = limiter(Policy::token_bucket("bucket", Quota::per_second(10), 10));
    let acme = Caller::new("acme");
    // The first lease comes back a round trip after the first request.
    eventually(
        "no lease came",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || windowed.check(&acme).await.is_allowed(),
    )
    .await;
    let refused = bucket.check(&acme).await;
    assert!(
        matches!(refused, Decision::Unavailable { .. }),
        "{refused:?}"
    );

    regional.kill();
    let refused = windowed.check(&acme).await;
    assert!(
        matches!(refused, Decision::Unavailable { .. }),
        "{refused:?}"
    );
    regional.restart();
    eventually(
        "not back after the restart",
        Duration::from_secs(10),
        Duration::from_millis(50),
        async || windowed.check(&acme).await.is_allowed(),
    )
    .await;
}

/// A call answered after the region's record of the caller has expired (the caller sent
/// nothing while it was on its way) is still written down: the answer makes the record
/// again, as a first sight of the caller (the write had failed on the record's missing
/// first-sight time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_after_the_record_expired_is_written_down() {
    let global = RedisServer::start();
    let regional = RedisServer::start();
    let wan = FaultProxy::start(global.port());
    let connect = |url: String| redis_backend(url, Duration::from_secs(10));
    let to_global = connect(wan.url());
    to_global.ping().await.expect("the global store answers");
    // Longer than the record lives without requests: two windows and two seconds.
    wan.set(Fault::Delay(Duration::from_millis(4_500)));
    let store = TwoTierBackend::builder("us-east", connect(regional.url()), to_global)
        .wan_rtt(Duration::from_millis(160))
        .wan_timeout(Duration::from_secs(10))
        .build()
        .expect("a valid region");
    let limiter = orders_limiter(
        &store,
        Policy::sliding_window("per-second", Quota::per_second(LIMIT)),
    );
    let key = "rl:{acme}:per-second:regional";
    let refused = limiter.check(&Caller::new("acme")).await;
    assert!(!refused.is_allowed(), "no lease yet: {refused:?}");
    assert_eq!(store.wan_calls(), 1);
    tokio::time::sleep(Duration::from_millis(4_200)).await;
    assert_eq!(
        regional.must(&["EXISTS", key]).trim(),
        "0",
        "the record expired"
    );
    // The first call also caches the script at the global store: two delayed round trips.
    eventually(
        "the answer did not make the record again",
        Duration::from_secs(15),
        Duration::from_millis(100),
        async || regional.must(&["EXISTS", key]).trim() == "1",
    )
    .await;
}

/// A leased unit spent after the window it was counted in has ended is counted in the
/// window it was spent in, and taken back from its own, with the region's next call: a
/// caller whose requests are a window apart is admitted on the unit leased after the
/// request before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_spent_after_its_window_is_counted_in_the_window_it_was_spent_in() {
    const WINDOW: u64 = 2_000;
    let global = RedisServer::start();
    let regional = RedisServer::start();
    let connect = |url: String| redis_backend(url, Duration::from_secs(2));
    let store = TwoTierBackend::builder("us-east", connect(regional.url()), connect(global.url()))
        .wan_rtt(Duration::from_millis(20))
        .build()
        .expect("a valid region");
    let limiter = orders_limiter(
        &store,
        Policy::sliding_window("per-two-seconds", Quota::per_seconds(LIMIT, WINDOW / 1_000)),
    );
    let global_key = "rl:{acme}:per-two-seconds:two-tier";
    let field = |name: &str| -> u64 {
        global
            .must(&["HGET", global_key, name])
            .trim()
            .parse()
            .unwrap_or(0)
    };
    // Starts a window's tenth in, by the global store's clock (a machine's one clock here).
    let into_next_window = || {
        let now = unix_millis();
        Duration::from_millis(WINDOW - now % WINDOW + WINDOW / 10)
    };
    tokio::time::sleep(into_next_window()).await;
    let first = limiter.check(&Caller::new("acme")).await;
    assert!(!first.is_allowed(), "no lease yet: {first:?}");
    eventually(
        "no lease came",
        Duration::from_secs(1),
        Duration::from_millis(20),
        async || field("c") != 0,
    )
    .await;
    // Let the answer be written down in the region.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let leased = field("c");

    tokio::time::sleep(into_next_window()).await;
    let second = limiter.check(&Caller::new("acme")).await;
    assert!(
        second.is_allowed(),
        "the unit leased in the window before: {second:?}"
    );
    // The call that follows moves the unit: one less in the previous window, one more in
    // this one besides the new lease, which the region holds whole (the units of the
    // previous window it held went back with that answer, to be given back next call).
    eventually(
        "the unit was not moved",
        Duration::from_secs(1),
        Duration::from_millis(20),
        async || field("p") != leased,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let held: u64 = regional
        .must(&["HGET", "rl:{acme}:per-two-seconds:regional", "h"])
        .trim()
        .parse()
        .expect("units held");
    assert_eq!(field("p"), leased - 1, "taken back from its own window");
    assert_eq!(
        field("c"),
        held + 1,
        "counted in this window, beside the new lease"
    );
}

/// lua/global.lua run at `now` given as its last argument instead of Redis's TIME.
fn global_script() -> redis::Script {
    redis::Script::new(
        &[
            include_str!("../../lua/common.lua"),
            include_str!("../../lua/window.lua"),
            "local now = tonumber(ARGV[#ARGV])\n",
            include_str!("../../lua/global.lua"),
        ]
        .concat(),
    )
}

/// A region's call to the global store at `now`: wanting `want`, holding `held` units
/// counted at `held_at`, giving back `given` counted at `given_at`, and having spent
/// `moved` units after their window (in `now`'s window). No share (no demand reported),
/// so that what is granted is the count's room alone. Returns { granted, used, share, now }.
#[allow(clippy::too_many_arguments)]
fn global_call(
    connection: &mut redis::Connection,
    region: &str,
    now: u64,
    want: u64,
    held: (u64, u64),
    given: (u64, u64),
    moved: u64,
) -> Vec<u64> {
    let window = 1_000;
    let start = now - now % window;
    global_script()
        .key("global:{acme}")
        .arg(&[10, window][..])
        .arg(region)
        .arg("demand")
        .arg(&[0, 0][..])
        .arg(&[0i64, 0, -1][..])
        .arg(&[0, 0, 0][..])
        .arg(&[0, want, given.0, given.1][..])
        .arg(&[start, 0, moved][..])
        .arg(&[held.0, held.1, now][..])
        .invoke(connection)
        .expect("the global script answers")
}

/// The global store keeps room in a window for the leased units of the previous one that
/// a region may still spend, which it then counts in this one: region a leases the whole
/// limit half a window before its end, and holds it; late in the next window region b is
/// granted nothing while a may still spend them, and what a gives back unspent is b's.
#[test]
fn a_lease_leaves_room_for_units_of_the_previous_window_still_held() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut connection = client.get_connection().unwrap();
    let w = 1_000_000;
    let leased = global_call(&mut connection, "a", w + 500, 10, (0, 0), (0, 0), 0);
    assert_eq!(leased[0], 10, "the whole limit: {leased:?}");
    // 900 ms into the next window the previous one weighs a tenth: 1 of the 10. Were a's
    // units not held, 9 would fit; a may spend all 10 before this window ends.
    let late = global_call(&mut connection, "b", w + 1_900, 10, (0, 0), (0, 0), 0);
    assert_eq!(late[0], 0, "a's 10 units may still be spent: {late:?}");
    // a says it holds them still, and spends none: nothing for a either.
    let again = global_call(
        &mut connection,
        "a",
        w + 1_910,
        10,
        (10, w + 500),
        (0, 0),
        0,
    );
    assert_eq!(again[0], 0, "{again:?}");
    // a gives them back unspent (and holds none): the window's room is b's.
    let back = global_call(&mut connection, "a", w + 1_920, 0, (0, 0), (10, w + 500), 0);
    assert_eq!(back[0], 0, "{back:?}");
    let freed = global_call(&mut connection, "b", w + 1_930, 10, (0, 0), (0, 0), 0);
    assert_eq!(freed[0], 10, "a's units went back: {freed:?}");
}

/// Each WAN call is counted by its result in `tollgate_wan_calls_total`: units leased,
/// an answer with none (the limit used up), and no answer (the global store cut off).
#[test]
fn wan_calls_are_counted_by_result() {
    let global = RedisServer::start();
    let regional = RedisServer::start();
    let wan = FaultProxy::start(global.port());
    let ((), snapshot) = with_recorder(|_| async {
        let connect = |url: String| redis_backend(url, Duration::from_secs(2));
        let store = TwoTierBackend::builder("us-east", connect(regional.url()), connect(wan.url()))
            .wan_rtt(Duration::from_millis(20))
            .wan_timeout(Duration::from_millis(200))
            .build()
            .expect("a valid region");
        let limiter = orders_limiter(
            &store,
            Policy::sliding_window("per-minute", Quota::per_minute(5)),
        );
        let acme = Caller::new("acme");
        // More than the limit: leased, then answered with nothing.
        for _ in 0..20 {
            limiter.check(&acme).await;
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        wan.set(Fault::Blackhole);
        for _ in 0..10 {
            limiter.check(&acme).await;
            tokio::time::sleep(Duration::from_millis(60)).await;
        }
    });
    let calls = |result: &str| {
        counter(
            &snapshot,
            "tollgate_wan_calls_total",
            &[("region", "us-east"), ("result", result)],
        )
    };
    assert!(calls("granted") >= 1, "granted: {}", calls("granted"));
    assert!(calls("empty") >= 1, "empty: {}", calls("empty"));
    assert!(calls("failed") >= 1, "failed: {}", calls("failed"));
}

/// A region granted units of a new window keeps those of the previous one until the answer
/// puts them back, and may spend them meanwhile: the room kept for them stays until its
/// next call says they went back.
#[test]
fn old_units_keep_their_room_until_the_region_gives_them_back() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut connection = client.get_connection().unwrap();
    let w = 1_000_000;
    assert_eq!(
        global_call(&mut connection, "a", w + 500, 10, (0, 0), (0, 0), 0)[0],
        10
    );
    // Late in the next window a still holds 4 of them, and is granted 5 more: the previous
    // window weighs 1, its 4 units 4.
    let renewed = global_call(&mut connection, "a", w + 1_900, 10, (4, w + 500), (0, 0), 0);
    assert_eq!(renewed[0], 5, "{renewed:?}");
    // Until a's answer arrives it may spend the 4: nothing for b.
    let late = global_call(&mut connection, "b", w + 1_910, 10, (0, 0), (0, 0), 0);
    assert_eq!(late[0], 0, "a's 4 old units may still be spent: {late:?}");
    // a's next call gives them back and holds the 5 new ones: b gets the room left.
    let back = global_call(
        &mut connection,
        "a",
        w + 1_920,
        0,
        (5, w + 1_900),
        (4, w + 500),
        0,
    );
    assert_eq!(back[0], 0, "{back:?}");
    let freed = global_call(&mut connection, "b", w + 1_930, 10, (0, 0), (0, 0), 0);
    assert_eq!(freed[0], 4, "{freed:?}");
}
