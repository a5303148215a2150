use super::profile::si_bytes;
use super::*;

fn settings(yaml: &str) -> TenantLimitsSettings {
    serde_saphyr::from_str(yaml).unwrap()
}

#[test]
fn a_bucket_refills_at_the_rate_up_to_the_burst() {
    let s = settings(
        "ingestion_rate_mb: 1\ningestion_burst_size_mb: 2\noverrides:\n  noisy: {ingestion_rate_mb: 0.5}\n",
    );
    assert!(s.problems("limits").is_empty());
    assert_eq!(s.rate_of("noisy").ingestion_burst_size_mb, 2.0);
    let l = TenantLimiter::new(s);
    let t0 = Instant::now();
    let mib = 1 << 20;
    // The burst at once, then nothing more.
    assert!(l.admit_at(Some("a"), 2 * mib, t0).is_ok());
    let refused = l.admit_at(Some("a"), mib, t0).unwrap_err();
    assert_eq!(refused.retry_after_seconds(), Some(1));
    assert_eq!(refused.limit_bytes, mib as u64);
    // A second later one MiB is back; the refusal took nothing.
    assert!(
        l.admit_at(Some("a"), mib, t0 + Duration::from_secs(1))
            .is_ok()
    );
    // Another tenant has its own bucket; the override's rate is its own.
    assert!(l.admit_at(Some("noisy"), 2 * mib, t0).is_ok());
    let r = l.admit_at(Some("noisy"), mib, t0).unwrap_err();
    assert_eq!(r.retry_after_seconds(), Some(2));
    // Larger than the burst: never.
    assert_eq!(
        l.admit_at(Some("b"), 3 * mib, t0).unwrap_err().retry_after,
        None
    );
    // No tenant is `anonymous`, limited like any other.
    assert!(l.admit_at(None, 2 * mib, t0).is_ok());
    assert!(l.admit_at(Some(""), 1, t0).is_err());
}

#[test]
fn label_limits_as_pyroscope_words_them() {
    let s = settings(
        "max_label_names_per_series: 3\nmax_label_name_length: 8\nmax_label_value_length: 5\n\
         overrides:\n  roomy: {max_label_names_per_series: 10, max_label_value_length: 0}\n",
    );
    assert!(s.limits_anything());
    let l = TenantLimiter::new(s);
    let ok = [("__name__", "cpu"), ("a", "1")];
    assert!(l.check_labels(Some("t"), ok.iter().copied()).is_ok());
    let many = [("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")];
    let e = l.check_labels(Some("t"), many.iter().copied()).unwrap_err();
    assert_eq!(e.reason, "max_label_names_per_series");
    assert!(
        e.message.contains("has 4 label names; limit 3"),
        "{}",
        e.message
    );
    assert!(l.check_labels(Some("roomy"), many.iter().copied()).is_ok());
    let long_name = [("a_long_name", "1")];
    let e = l.check_labels(None, long_name.iter().copied()).unwrap_err();
    assert_eq!(e.reason, "label_name_too_long");
    assert!(e.message.contains("has label name too long: 'a_long_name'"));
    let long_value = [("a", "123456")];
    let e = l
        .check_labels(Some("t"), long_value.iter().copied())
        .unwrap_err();
    assert_eq!(e.reason, "label_value_too_long");
    assert!(
        l.check_labels(Some("roomy"), long_value.iter().copied())
            .is_ok()
    );
}

#[test]
fn profile_limits_in_pyroscopes_order_and_words() {
    let s = settings(
        "max_profile_size_bytes: 4194304\nmax_profile_stacktrace_samples: 16000\n\
         max_profile_stacktrace_depth: 1000\nmax_profile_stacktrace_sample_labels: 100\n\
         overrides:\n  deep: {max_profile_stacktrace_depth: 0, max_profile_size_bytes: 0}\n",
    );
    assert!(s.limits_profiles() && s.limits_anything());
    assert!(!TenantLimitsSettings::default().limits_profiles());
    let l = TenantLimiter::new(s);
    let limits = l.profile_limits(Some("t"));
    assert!(limits.any());
    let labels = [("__name__", "process_cpu"), ("service_name", "a")];
    let within = ProfileShape {
        size: 4194304,
        samples: 16000,
        deepest_stack: 1000,
        most_sample_labels: 100,
    };
    let check = |shape: ProfileShape, source| limits.check(&shape, source, labels.iter().copied());
    assert_eq!(check(within, ProfileSource::Push), Ok(None));
    // Size first, in the words of each path.
    let big = ProfileShape {
        size: 4194305,
        samples: 16001,
        ..within
    };
    let e = check(big, ProfileSource::Push).unwrap_err();
    assert_eq!(e.reason, "profile_size_limit");
    assert!(
        e.message
            .starts_with("uncompressed profile payload size exceeds limit of 4.2 MB"),
        "{}",
        e.message
    );
    let e = check(big, ProfileSource::IngestPprof).unwrap_err();
    assert!(
        e.message
            .starts_with("decompressed size exceeds maximum allowed size of 4194304 bytes"),
        "{}",
        e.message
    );
    let e = check(big, ProfileSource::Converted).unwrap_err();
    assert!(
        e.message.contains(
            "exceeds the size limit (max_profile_size_byte, actual: 4194305, limit: 4194304)"
        ),
        "{}",
        e.message
    );
    // Then samples.
    let e = check(
        ProfileShape {
            samples: 16001,
            ..within
        },
        ProfileSource::Push,
    )
    .unwrap_err();
    assert_eq!(e.reason, "samples_limit");
    assert_eq!(
        e.message,
        "the profile with labels '{__name__=\"process_cpu\", service_name=\"a\"}' exceeds the samples count limit (max_profile_stacktrace_samples, actual: 16001, limit: 16000) (tenant \"t\")"
    );
    let e = check(
        ProfileShape {
            most_sample_labels: 101,
            ..within
        },
        ProfileSource::Push,
    )
    .unwrap_err();
    assert_eq!(e.reason, "sample_labels_limit");
    // A deep stack is truncated, never refused.
    let deep = ProfileShape {
        deepest_stack: 1001,
        ..within
    };
    assert_eq!(check(deep, ProfileSource::Push), Ok(Some(1000)));
    let roomy = l.profile_limits(Some("deep"));
    assert_eq!(
        roomy.check(
            &ProfileShape {
                size: usize::MAX,
                ..deep
            },
            ProfileSource::Push,
            labels.iter().copied()
        ),
        Ok(None)
    );
    assert_eq!(roomy.tenant, "deep");
    assert_eq!(l.profile_limits(None).tenant, ANONYMOUS_TENANT);
}

#[test]
fn sizes_in_si_units_as_go_humanize_writes_them() {
    for (n, text) in [
        (7, "7 B"),
        (999, "999 B"),
        (1500, "1.5 kB"),
        (15_000, "15 kB"),
        (4_194_304, "4.2 MB"),
        (9_960_000, "10 MB"),
        (1 << 30, "1.1 GB"),
    ] {
        assert_eq!(si_bytes(n), text, "{n}");
    }
}

#[test]
fn no_rate_is_no_limit_and_bad_numbers_are_named() {
    let l = TenantLimiter::new(TenantLimitsSettings::default());
    assert!(l.admit(Some("a"), usize::MAX).is_ok());
    let s = settings("ingestion_rate_mb: -1\noverrides:\n  x: {ingestion_burst_size_mb: .nan}\n");
    let problems = s.problems("limits");
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert_eq!(
        problems[1].path,
        "limits.overrides.x.ingestion_burst_size_mb"
    );
    assert!(serde_saphyr::from_str::<TenantLimitsSettings>("rate: 1\n").is_err());
}
