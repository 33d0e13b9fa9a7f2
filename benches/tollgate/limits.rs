//! Group `limits`: what the limits beyond rates cost per request, each beside the sliding
//! window counter's (the sliding log's rows are in `in_process`, at a full window):
//! a lockout on a policy, requests in flight per caller, and load shedding with priority
//! classes, on an in-memory service with 10,000 callers in turn.

use std::convert::Infallible;
use std::hint::black_box;
use std::time::Duration;

use axum::body::Body;
use criterion::{Bencher, Criterion, Throughput};
use http::{Request, Response};
use tollgate::in_flight::InFlightLayer;
use tollgate::key::HeaderKey;
use tollgate::response::HeaderMode;
use tollgate::shed::ConcurrencyShedLayer;
use tollgate::{Caller, InMemoryBackend, Limiter, Policy, RateLimitLayer};
use tower::ServiceBuilder;

use crate::report::{Row, median_ns, ns, ran, write_rows};
use crate::support::{BIG, CALLERS, big_window, callers, drive, ready_now};

/// The members of the nested-budget rows.
const NESTED_MEMBERS: usize = 20_000;

pub(crate) fn bench(c: &mut Criterion) {
    const GROUP: &str = "limits";
    let (runtime, customers) = crate::support::layer_setup();
    let reports = tower::service_fn(|_request: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Body::from("[]")))
    });
    let limiter = |policy: Policy| {
        Limiter::builder()
            .name("limits")
            .backend(InMemoryBackend::new())
            .policy(policy)
            .build()
    };
    let mut group = c.benchmark_group(GROUP);
    group.throughput(Throughput::Elements(1));

    // The decision alone: a sliding window, and the same with a lockout (never reached).
    let callers = callers(CALLERS);
    for (id, policy) in [
        ("check_sliding_window", big_window()),
        (
            "check_with_lockout",
            big_window().lock_out_for(Duration::from_secs(600)),
        ),
    ] {
        let limiter = limiter(policy);
        group.bench_function(id, |b| {
            ran(GROUP, id);
            decide_in_turn_now(b, &limiter, &callers);
        });
    }

    // Nested budgets: 20,000 members of one team, each with a window of its own beside the
    // team's, against as many members each in a team of its own. A team's size should not
    // slow its members' decisions.
    let nested = Limiter::builder()
        .name("limits-nested")
        .backend(InMemoryBackend::new())
        .policy(big_window())
        .level("team", [big_window()])
        .build();
    let members = crate::support::callers(NESTED_MEMBERS);
    for (id, team_of) in [
        ("check_nested_one_team", (|_| 0) as fn(usize) -> usize),
        ("check_nested_own_teams", |i| i),
    ] {
        let members: Vec<Caller> = members
            .iter()
            .enumerate()
            .map(|(i, member)| {
                member
                    .clone()
                    .within("team", format!("team-{}", team_of(i)))
            })
            .collect();
        // Every member met once, so that what is timed is a team of all of them.
        for member in &members {
            black_box(ready_now(nested.check(member)));
        }
        group.bench_function(id, |b| {
            ran(GROUP, id);
            decide_in_turn_now(b, &nested, &members);
        });
    }

    // Through a layer, with the fields on the response: a rate, slots, shedding.
    let key = HeaderKey::new("x-customer-id");
    let window = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(limiter(big_window()))
                .key(key.clone())
                .headers(HeaderMode::Always)
                .decision_on_every_response(false),
        )
        .service(reports);
    group.bench_function("layer_sliding_window", |b| {
        ran(GROUP, "layer_sliding_window");
        drive(b, &runtime, &window, &customers)
    });
    let in_flight = ServiceBuilder::new()
        .layer(InFlightLayer::new("reports", BIG, InMemoryBackend::new()).key(key))
        .service(reports);
    group.bench_function("layer_in_flight", |b| {
        ran(GROUP, "layer_in_flight");
        drive(b, &runtime, &in_flight, &customers)
    });
    let shed = ServiceBuilder::new()
        .layer(
            ConcurrencyShedLayer::new(1_000)
                .critical_when(|request| request.uri.path() == "/login")
                .reserve(200),
        )
        .service(reports);
    group.bench_function("layer_shed_classes", |b| {
        ran(GROUP, "layer_shed_classes");
        drive(b, &runtime, &shed, &customers)
    });
    group.finish();

    let get = |id| median_ns(GROUP, id);
    let mut rows = Vec::new();
    if let (Some(one_team), Some(own_teams)) =
        (get("check_nested_one_team"), get("check_nested_own_teams"))
    {
        let ratio = one_team / own_teams;
        rows.push((
            "limits/nested_members",
            Row::new(
                format!("`Limiter::check`, nested budgets: {NESTED_MEMBERS} members of one team in turn (a sliding window each, and the team's)"),
                format!("{}/request", ns(one_team)),
            )
            .peer(format!("as many members, each in a team of its own: {}/request", ns(own_teams)))
            .ratio(format!("{ratio:.2}x"))
            .target("≤ 1.50x", ratio <= 1.5),
        ));
    }
    let compared = [
        (
            "limits/lockout",
            "check_with_lockout",
            "check_sliding_window",
            "`Limiter::check`, 10,000 callers, a sliding window with a lockout (`Policy::lock_out_for`)",
            "the same sliding window without",
        ),
        (
            "limits/in_flight",
            "layer_in_flight",
            "layer_sliding_window",
            "Layer, 10,000 callers: requests in flight per caller (`InFlightLayer`, in process), a slot taken and freed, fields on",
            "`RateLimitLayer` with a sliding window, fields on",
        ),
        (
            "limits/shed_classes",
            "layer_shed_classes",
            "layer_sliding_window",
            "Layer, 10,000 callers: load shedding with a critical class (`ConcurrencyShedLayer::critical_when`, `reserve`)",
            "`RateLimitLayer` with a sliding window, fields on",
        ),
    ];
    for (row, ours, beside, what, beside_label) in compared {
        let (Some(ours), Some(beside)) = (get(ours), get(beside)) else {
            continue;
        };
        rows.push((
            row,
            Row::new(what, format!("{}/request", ns(ours)))
                .peer(format!("{beside_label}: {}/request", ns(beside)))
                .ratio(format!("{:.2}x", ours / beside)),
        ));
    }
    if !rows.is_empty() {
        write_rows("limits.tsv", &rows);
    }
}

/// Times `limiter`'s decisions on `callers` in turn, each answered at once.
fn decide_in_turn_now(b: &mut Bencher<'_>, limiter: &Limiter, callers: &[Caller]) {
    let mut i = 0;
    b.iter(|| {
        i = (i + 1) % callers.len();
        black_box(ready_now(limiter.check(&callers[i])));
    });
}
