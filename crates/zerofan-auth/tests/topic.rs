//! The filter relations used by the SUBSCRIBE check agree with matching.

use proptest::prelude::*;
use zerofan_auth::topic::{covers, matches, overlaps, validate_filter};

fn level() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["a", "b", "", "$SYS", "$x"])
}

fn topic() -> impl Strategy<Value = String> {
    prop::collection::vec(level(), 1..5).prop_map(|v| v.join("/"))
}

fn filter() -> impl Strategy<Value = String> {
    (
        prop::collection::vec(prop_oneof![level(), Just("+")], 0..4),
        any::<bool>(),
    )
        .prop_map(|(mut v, hash)| {
            if hash || v.is_empty() {
                v.push("#");
            }
            let f = v.join("/");
            if f.is_empty() {
                "#".to_string() // "" is not a filter
            } else {
                f
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn generated_filters_are_valid(f in filter()) {
        prop_assert!(validate_filter(&f).is_ok(), "{f}");
    }

    /// A topic matched by both filters means they overlap.
    #[test]
    fn overlap_is_complete(a in filter(), b in filter(), t in topic()) {
        if matches(&a, &t) && matches(&b, &t) {
            prop_assert!(overlaps(&a, &b), "{a} {b} {t}");
        }
        prop_assert_eq!(overlaps(&a, &b), overlaps(&b, &a));
    }

    /// `covers(o, i)` means every topic of `i` is a topic of `o`.
    #[test]
    fn cover_is_sound(o in filter(), i in filter(), t in topic()) {
        if covers(&o, &i) && matches(&i, &t) {
            prop_assert!(matches(&o, &t), "{o} covers {i} but not {t}");
        }
    }

    /// A filter covers itself and overlaps every topic it matches.
    #[test]
    fn reflexive(f in filter(), t in topic()) {
        prop_assert!(covers(&f, &f));
        if matches(&f, &t) {
            prop_assert!(overlaps(&f, &t));
            prop_assert!(covers(&f, &t));
        }
    }
}

#[test]
fn overlap_is_exact_on_small_cases() {
    // For these, an overlap has a witness among short topics.
    let levels = ["a", "b", "", "$SYS"];
    let mut topics = Vec::new();
    for n in 1..=3 {
        let mut idx = vec![0usize; n];
        loop {
            topics.push(idx.iter().map(|&i| levels[i]).collect::<Vec<_>>().join("/"));
            let mut k = 0;
            while k < n {
                idx[k] += 1;
                if idx[k] < levels.len() {
                    break;
                }
                idx[k] = 0;
                k += 1;
            }
            if k == n {
                break;
            }
        }
    }
    let filters = [
        "#", "+", "a", "a/#", "+/b", "a/+", "$SYS/#", "+/+", "a/b/#", "/#", "+/#",
    ];
    for a in filters {
        for b in filters {
            let witness = topics.iter().any(|t| matches(a, t) && matches(b, t));
            assert_eq!(overlaps(a, b), witness, "{a} vs {b}");
            let covered = topics.iter().all(|t| !matches(b, t) || matches(a, t));
            if covers(a, b) {
                assert!(covered, "{a} covers {b}");
            }
        }
    }
}
