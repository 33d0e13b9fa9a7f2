//! The typed fields against the layer's writer and against a second reading of the draft,
//! written here over sfv's parsed types: what is written reads back, both readings agree on
//! any input, garbage is an error.

use headers::Header;
use http::HeaderValue;
use proptest::prelude::*;

use super::error::InvalidField;
use super::format::MAX_INTEGER;
use super::policy::{QuotaPolicy, RateLimitPolicyHeader};
use super::retry_after::RetryAfter;
use super::state::{QuotaState, RateLimitHeader};
use crate::http::headers::{policy_field_of, state_field_of};

fn encoded<H: Header>(header: &H) -> Vec<HeaderValue> {
    let mut values = Vec::new();
    header.encode(&mut values);
    values
}

fn decoded<H: Header>(values: &[HeaderValue]) -> Result<H, headers::Error> {
    H::decode(&mut values.iter())
}

/// An sfv parameter value as the draft reads it: `Some(Ok)` for the kind asked for, `Some(Err)`
/// for another kind, `None` when absent.
fn sfv_param<'a>(params: &'a sfv::Parameters, key: &str) -> Option<&'a sfv::BareItem> {
    params
        .iter()
        .find_map(|(k, value)| (k.as_str() == key).then_some(value))
}

fn sfv_integer(params: &sfv::Parameters, key: &str) -> Result<Option<u64>, ()> {
    match sfv_param(params, key) {
        None => Ok(None),
        Some(sfv::BareItem::Integer(value)) => {
            u64::try_from(i64::from(*value)).map(Some).map_err(|_| ())
        }
        Some(_) => Err(()),
    }
}

/// The draft's reading of `input`, through sfv: each item a string with its parameters.
fn sfv_items(input: &[u8]) -> Result<Vec<(String, sfv::Parameters)>, ()> {
    let list = sfv::Parser::new(input)
        .parse::<sfv::List>()
        .map_err(|_| ())?;
    list.into_iter()
        .map(|entry| match entry {
            sfv::ListEntry::Item(sfv::Item {
                bare_item: sfv::BareItem::String(name),
                params,
            }) => Ok((name.as_str().to_owned(), params)),
            _ => Err(()),
        })
        .collect()
}

fn sfv_policy(input: &[u8]) -> Result<RateLimitPolicyHeader, ()> {
    let mut field = RateLimitPolicyHeader::new();
    for (name, params) in sfv_items(input)? {
        let mut policy = QuotaPolicy::new(name, sfv_integer(&params, "q")?.ok_or(())?).unwrap();
        if let Some(w) = sfv_integer(&params, "w")? {
            policy = policy.with_window_secs(w);
        }
        match sfv_param(&params, "qu") {
            None => {}
            Some(sfv::BareItem::String(unit)) => policy = policy.with_unit(unit.as_str()).unwrap(),
            Some(_) => return Err(()),
        }
        match sfv_param(&params, "pk") {
            None => {}
            Some(sfv::BareItem::ByteSequence(pk)) => policy = policy.with_partition_key(pk.clone()),
            Some(_) => return Err(()),
        }
        field = field.policy(policy);
    }
    Ok(field)
}

fn sfv_state(input: &[u8]) -> Result<RateLimitHeader, ()> {
    let mut field = RateLimitHeader::new();
    for (name, params) in sfv_items(input)? {
        let mut state = QuotaState::new(name, sfv_integer(&params, "r")?.ok_or(())?).unwrap();
        if let Some(t) = sfv_integer(&params, "t")? {
            state = state.with_reset_secs(t);
        }
        match sfv_param(&params, "pk") {
            None => {}
            Some(sfv::BareItem::ByteSequence(pk)) => state = state.with_partition_key(pk.clone()),
            Some(_) => return Err(()),
        }
        field = field.state(state);
    }
    Ok(field)
}

fn name() -> impl Strategy<Value = String> {
    "[ -~]{0,12}"
}

fn integer() -> impl Strategy<Value = u64> {
    prop_oneof![
        0..100u64,
        any::<u64>(),
        Just(MAX_INTEGER),
        Just(MAX_INTEGER + 1)
    ]
}

fn policy_field() -> impl Strategy<Value = RateLimitPolicyHeader> {
    let item = (
        name(),
        integer(),
        proptest::option::of(integer()),
        proptest::option::of("[ -~]{0,20}"),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..20)),
    )
        .prop_map(|(name, q, w, unit, pk)| {
            let mut policy = QuotaPolicy::new(name, q).unwrap();
            if let Some(w) = w {
                policy = policy.with_window_secs(w);
            }
            if let Some(unit) = unit {
                policy = policy.with_unit(unit).unwrap();
            }
            if let Some(pk) = pk {
                policy = policy.with_partition_key(pk);
            }
            policy
        });
    proptest::collection::vec(item, 1..5).prop_map(|items| {
        items
            .into_iter()
            .fold(RateLimitPolicyHeader::new(), RateLimitPolicyHeader::policy)
    })
}

fn state_field() -> impl Strategy<Value = RateLimitHeader> {
    let item = (
        name(),
        integer(),
        proptest::option::of(integer()),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..20)),
    )
        .prop_map(|(name, r, t, pk)| {
            let mut state = QuotaState::new(name, r).unwrap();
            if let Some(t) = t {
                state = state.with_reset_secs(t);
            }
            if let Some(pk) = pk {
                state = state.with_partition_key(pk);
            }
            state
        });
    proptest::collection::vec(item, 1..5).prop_map(|items| {
        items
            .into_iter()
            .fold(RateLimitHeader::new(), RateLimitHeader::state)
    })
}

/// Inputs near the fields' grammar: pieces of valid and invalid syntax, so that random
/// inputs reach every branch of both parsers rather than failing at the first byte.
fn near_field() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(&b"\""[..]),
        Just(&b"\\"[..]),
        Just(&b";"[..]),
        Just(&b"="[..]),
        Just(&b","[..]),
        Just(&b", "[..]),
        Just(&b" "[..]),
        Just(&b"\t"[..]),
        Just(&b"("[..]),
        Just(&b")"[..]),
        Just(&b":"[..]),
        Just(&b"?1"[..]),
        Just(&b"?"[..]),
        Just(&b"@"[..]),
        Just(&b"%\""[..]),
        Just(&b"%c3%a9"[..]),
        Just(&b"%"[..]),
        Just(&b"-"[..]),
        Just(&b"."[..]),
        Just(&b"0"[..]),
        Just(&b"7"[..]),
        Just(&b"1234567890123"[..]),
        Just(&b"q"[..]),
        Just(&b"r"[..]),
        Just(&b"t"[..]),
        Just(&b"w"[..]),
        Just(&b"pk"[..]),
        Just(&b"qu"[..]),
        Just(&b"*"[..]),
        Just(&b"A"[..]),
        Just(&b"AQ=="[..]),
        Just(&b"AQ="[..]),
        Just(&b"/+"[..]),
        Just(&b"\"per-second\";r=0;t=1"[..]),
        Just(&b"\"day\";q=1000;w=86400;pk=:AAEC:"[..]),
        Just(&b"\x7f"[..]),
        Just(&b"\xc3\xa9"[..]),
    ];
    proptest::collection::vec(piece, 0..24).prop_map(|pieces| pieces.concat())
}

/// `input` with one byte replaced, inserted or removed.
fn mutated(input: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let len = input.len();
    (0..=len, any::<u8>(), 0..3u8).prop_map(move |(at, byte, how)| {
        let mut out = input.clone();
        match how {
            0 if at < out.len() => out[at] = byte,
            1 => out.insert(at, byte),
            _ if at < out.len() => {
                out.remove(at);
            }
            _ => {}
        }
        out
    })
}

fn agree(input: &[u8]) -> Result<(), TestCaseError> {
    prop_assert_eq!(
        RateLimitHeader::parse(input).ok(),
        sfv_state(input).ok(),
        "{:?}",
        String::from_utf8_lossy(input)
    );
    prop_assert_eq!(
        RateLimitPolicyHeader::parse(input).ok(),
        sfv_policy(input).ok(),
        "{:?}",
        String::from_utf8_lossy(input)
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn policies_read_back_what_they_write(field in policy_field()) {
        let values = encoded(&field);
        prop_assert_eq!(values.len(), 1);
        prop_assert_eq!(decoded::<RateLimitPolicyHeader>(&values).unwrap(), field.clone());
        // A general parser reads the same.
        prop_assert_eq!(sfv_policy(values[0].as_bytes()), Ok(field));
    }

    #[test]
    fn states_read_back_what_they_write(field in state_field()) {
        let values = encoded(&field);
        prop_assert_eq!(values.len(), 1);
        prop_assert_eq!(decoded::<RateLimitHeader>(&values).unwrap(), field.clone());
        prop_assert_eq!(sfv_state(values[0].as_bytes()), Ok(field));
    }

    #[test]
    fn fields_split_over_lines_read_as_one(a in state_field(), b in state_field()) {
        let values = [encoded(&a), encoded(&b)].concat();
        let both = b.states().iter().cloned().fold(a, RateLimitHeader::state);
        prop_assert_eq!(decoded::<RateLimitHeader>(&values).unwrap(), both);
    }

    #[test]
    fn both_parsers_agree_near_the_grammar(input in near_field()) {
        agree(&input)?;
    }

    #[test]
    fn both_parsers_agree_on_written_fields_with_a_byte_changed(
        input in state_field().prop_flat_map(|f| mutated(encoded(&f)[0].as_bytes().to_vec())),
    ) {
        agree(&input)?;
    }

    #[test]
    fn both_parsers_agree_on_written_policies_with_a_byte_changed(
        input in policy_field().prop_flat_map(|f| mutated(encoded(&f)[0].as_bytes().to_vec())),
    ) {
        agree(&input)?;
    }

    #[test]
    fn garbage_is_an_error(input in proptest::collection::vec(any::<u8>(), 0..200)) {
        agree(&input)?;
        // No Structured Field holds a control byte (tab aside) or a non-ASCII one.
        if input.iter().any(|b| !(*b == b'\t' || (0x20..0x7f).contains(b))) {
            prop_assert!(RateLimitHeader::parse(&input).is_err());
            prop_assert!(RateLimitPolicyHeader::parse(&input).is_err());
        }
        if let Ok(value) = HeaderValue::from_bytes(&input) {
            let values = [value];
            let _ = decoded::<RateLimitHeader>(&values);
            let _ = decoded::<RateLimitPolicyHeader>(&values);
            let _ = decoded::<RetryAfter>(&values);
        }
    }

    #[test]
    fn the_layers_writer_and_the_typed_headers_write_the_same_bytes(
        items in proptest::collection::vec((name(), integer(), integer()), 1..5),
        pk in proptest::option::of(proptest::collection::vec(any::<u8>(), 16)),
    ) {
        let triples: Vec<(&str, u64, u64)> = items.iter().map(|(n, a, b)| (n.as_str(), *a, *b)).collect();
        let written = state_field_of(triples.iter().copied(), pk.as_deref()).unwrap();
        let typed = items.iter().fold(RateLimitHeader::new(), |field, (n, r, t)| {
            let state = QuotaState::new(n.clone(), *r).unwrap().with_reset_secs(*t);
            field.state(match &pk {
                Some(pk) => state.with_partition_key(pk.clone()),
                None => state,
            })
        });
        prop_assert_eq!(&encoded(&typed)[0], &written);
        prop_assert_eq!(decoded::<RateLimitHeader>(&[written]).unwrap(), typed);

        let written = policy_field_of(triples.iter().copied(), pk.as_deref()).unwrap();
        let typed = items.iter().fold(RateLimitPolicyHeader::new(), |field, (n, q, w)| {
            let policy = QuotaPolicy::new(n.clone(), *q).unwrap().with_window_secs(*w);
            field.policy(match &pk {
                Some(pk) => policy.with_partition_key(pk.clone()),
                None => policy,
            })
        });
        prop_assert_eq!(&encoded(&typed)[0], &written);
        prop_assert_eq!(decoded::<RateLimitPolicyHeader>(&[written]).unwrap(), typed);
    }

    #[test]
    fn retry_after_reads_back(secs in any::<u64>(), date in 0..253_402_300_799u64) {
        let delay = RetryAfter::from_delay(std::time::Duration::from_secs(secs));
        prop_assert_eq!(decoded::<RetryAfter>(&encoded(&delay)).unwrap(), delay);
        let date = RetryAfter::from_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(date));
        prop_assert_eq!(decoded::<RetryAfter>(&encoded(&date)).unwrap(), date);
    }
}

#[test]
fn an_absent_field_is_an_error_and_an_empty_one_an_empty_list() {
    assert!(decoded::<RateLimitHeader>(&[]).is_err());
    assert!(decoded::<RetryAfter>(&[]).is_err());
    assert_eq!(RateLimitHeader::parse(b"").unwrap(), RateLimitHeader::new());
    assert_eq!(
        RateLimitHeader::parse(b"   ").unwrap(),
        RateLimitHeader::new()
    );
    assert!(encoded(&RateLimitHeader::new()).is_empty());
}

#[test]
fn retry_after_reads_seconds_and_the_three_date_forms() {
    use std::time::{Duration, UNIX_EPOCH};

    let mut map = http::HeaderMap::new();
    map.insert(http::header::RETRY_AFTER, HeaderValue::from_static("120"));
    let after: RetryAfter = headers::HeaderMapExt::typed_get(&map).unwrap();
    assert_eq!(after.wait_from(UNIX_EPOCH), Duration::from_secs(120));

    // 1994-11-06 08:49:37 UTC, as IMF-fixdate, RFC 850 and asctime write it.
    let date = UNIX_EPOCH + Duration::from_secs(784_111_777);
    for value in [
        &b"Sun, 06 Nov 1994 08:49:37 GMT"[..],
        b"Sunday, 06-Nov-94 08:49:37 GMT",
        b"Sun Nov  6 08:49:37 1994",
    ] {
        let after = RetryAfter::parse(value).unwrap();
        assert_eq!(after, RetryAfter::from_date(date), "{value:?}");
        assert_eq!(
            after.wait_from(date - Duration::from_secs(5)),
            Duration::from_secs(5)
        );
        // A date already past asks for no wait.
        assert_eq!(
            after.wait_from(date + Duration::from_secs(5)),
            Duration::ZERO
        );
    }

    for value in [&b"-5"[..], b"soon", b"1.5", b""] {
        assert!(RetryAfter::parse(value).is_err(), "{value:?}");
    }
    // More seconds than a u64 holds: as good as forever, not an error.
    assert_eq!(
        RetryAfter::parse(b"99999999999999999999999")
            .unwrap()
            .wait_from(UNIX_EPOCH),
        Duration::from_secs(u64::MAX)
    );
}

#[test]
fn retry_after_rounds_a_delay_up_and_a_date_down() {
    use std::time::{Duration, UNIX_EPOCH};

    // A client told to wait never calls early.
    assert_eq!(
        RetryAfter::from_delay(Duration::from_millis(1_200)),
        RetryAfter::parse(b"2").unwrap()
    );
    assert_eq!(
        RetryAfter::from_delay(Duration::from_secs(3)).wait_from(UNIX_EPOCH),
        Duration::from_secs(3)
    );
    // An HTTP date holds whole seconds.
    assert_eq!(
        RetryAfter::from_date(UNIX_EPOCH + Duration::from_millis(1_700_000_000_900)),
        RetryAfter::from_date(UNIX_EPOCH + Duration::from_secs(1_700_000_000))
    );
}

#[test]
fn errors_say_what_is_wrong() {
    let cases: [(&[u8], &str); 7] = [
        (b"\"a\";r=1,", "trailing"),
        (b"\"a\";t=1", "no `r`"),
        (b"(\"a\");r=1", "inner list"),
        (b"a;r=1", "not a policy name"),
        (b"\"a\";r=-1", "negative"),
        (b"\"a\";r=\"1\"", "not an integer"),
        (b"\"a\";r=1;pk=1", "not a byte sequence"),
    ];
    for (input, what) in cases {
        let error: InvalidField = RateLimitHeader::parse_with_reason(input).unwrap_err();
        assert!(error.to_string().contains(what), "{input:?}: {error}");
    }
    // A syntax error says where sfv stopped: here at the comma.
    assert_eq!(
        RateLimitHeader::parse_with_reason(b"\"a\";r=1,")
            .unwrap_err()
            .to_string(),
        "not a Structured Field list: trailing comma at byte 7"
    );
}

#[test]
fn the_public_parse_logs_what_is_wrong() {
    #[derive(Clone, Default)]
    struct Log(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Log {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    // The log's callsite registered here, before the subscriber: a callsite registers once
    // per process, and another test's thread registering it while this test's subscriber
    // is the only one would set its interest from that thread's (absent) subscriber,
    // after the rebuild below.
    assert!(RateLimitHeader::parse(b"\"a\";t=1").is_err());
    let log = Log::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let parsed = tracing::subscriber::with_default(subscriber, || {
        // Whether an event is wanted is cached per callsite for the whole process: another
        // test's thread that reached this one first, with no subscriber, left it off.
        tracing::callsite::rebuild_interest_cache();
        RateLimitHeader::parse(b"\"a\";t=1")
    });
    assert!(parsed.is_err());
    let log = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert!(log.contains("field=\"ratelimit\""), "{log}");
    assert!(log.contains("no `r`"), "{log}");
}

#[test]
fn edge_cases_read_as_a_general_parser_reads_them() {
    let ok: [&[u8]; 8] = [
        b"\"a\";r=1;t=2;r=3",
        b"  \"a\";r=1 ,\t\"b\";r=2  ",
        b"\"a\";r=1;pk=:AQ:",
        b"\"a\";r=1;pk=:AR==:",
        b"\"a \\\" \\\\\";r=0;t=1;x;y=?0;z=@1;d=%\"%c3%a9\";e=1.5;f=tok/en:x",
        b"\"a\";r=999999999999999",
        b"\"a\";r=1;t=0",
        b"",
    ];
    for input in ok {
        let ours = RateLimitHeader::parse(input).unwrap_or_else(|e| panic!("{input:?}: {e}"));
        assert_eq!(Ok(ours), sfv_state(input), "{input:?}");
    }
    assert_eq!(
        RateLimitHeader::parse(b"\"a\";r=1;t=2;r=3")
            .unwrap()
            .states()[0]
            .remaining(),
        3
    );
    let err: [&[u8]; 9] = [
        b"\"a\" ;r=1",
        b"\"a\";r=1000000000000000",
        b"\"a\";r=1;pk=:A:",
        b"\"a\";r=1;d=%\"%c3\"",
        b"\"a\";r=1;e=1.",
        b"\"a\";r=1;z=@1.5",
        b"\"a\";R=1",
        b"\"a\";r=1,,\"b\";r=1",
        b"\t\"a\";r=1",
    ];
    for input in err {
        assert!(RateLimitHeader::parse(input).is_err(), "{input:?}");
        assert!(sfv_state(input).is_err(), "{input:?}");
    }
}
