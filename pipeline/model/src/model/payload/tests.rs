use super::*;

#[test]
fn payload_from_bytes_never_decodes_until_asked() {
    let mut b = pprof::ProfileBuilder::new();
    b.sample_type("cpu", "nanoseconds");
    b.sample_root_first(["main", "hot"], vec![5]);
    let gz = pprof::gzip(&pprof::encode(&b.build()));
    let p = Payload::from_bytes(gz.clone(), 1 << 20);
    let clone = p.clone();
    assert!(!p.is_decoded());
    assert_eq!(
        clone.gzipped().unwrap().as_ptr(),
        gz.as_ptr(),
        "gzip bytes are shared, not copied"
    );
    assert!(!p.is_decoded());
    assert_eq!(p.decoded().unwrap().sample.len(), 1);
    assert!(clone.is_decoded(), "clones share the payload");
    assert_eq!(p.size_bytes(), gz.len());
    let detached = p.detach();
    assert_ne!(
        detached.gzipped().unwrap().as_ptr(),
        gz.as_ptr(),
        "detach copies"
    );
    assert_eq!(detached.gzipped().unwrap(), gz);
}

#[test]
fn payload_from_profile_encodes_once() {
    let mut b = pprof::ProfileBuilder::new();
    b.sample_type("samples", "count");
    b.sample_root_first(["a"], vec![1]);
    let p = Payload::from_profile(b.build());
    let gz = p.gzipped().unwrap();
    assert!(pprof::is_gzip(&gz));
    assert_eq!(pprof::decode(&gz, 1 << 20).unwrap(), *p.decoded().unwrap());
    assert!(
        p.size_bytes() > p.encoded().unwrap().bytes.len(),
        "the decoded profile is counted too"
    );
    assert_eq!(
        p.encoded().unwrap().bytes.as_ptr(),
        p.encoded().unwrap().bytes.as_ptr(),
        "encoded once"
    );
}

fn cpu_gzip() -> Bytes {
    let mut b = pprof::ProfileBuilder::new();
    b.sample_type("cpu", "nanoseconds");
    b.sample_root_first(["main", "hot"], vec![5]);
    pprof::gzip(&pprof::encode(&b.build()))
}

#[test]
fn a_form_is_added_once_and_counted() {
    let p = Payload::from_bytes(cpu_gzip(), 1 << 20);
    assert_eq!(p.arrived_as(), Format::Pprof);
    assert!(!p.has(Format::Otlp));
    let mut lost = Lost::default();
    let both = p.with_form(Format::Otlp, &mut lost).unwrap();
    assert!(both.has(Format::Otlp) && both.has(Format::Pprof));
    assert!(both.size_bytes() > p.size_bytes(), "both forms are counted");
    assert!(both.is_converted() && p.is_converted());
    let o = both.otlp().unwrap();
    assert!(
        Arc::ptr_eq(&o, &both.otlp().unwrap()),
        "the form is shared, not made again"
    );
    assert_eq!(
        both.gzipped().unwrap(),
        p.gzipped().unwrap(),
        "pprof bytes kept as they arrived"
    );
    let again = both.with_form(Format::Otlp, &mut lost).unwrap();
    assert!(
        Arc::ptr_eq(&again.inner, &both.inner),
        "no second conversion"
    );
}

#[test]
fn an_otlp_payload_converts_to_pprof_only_when_asked() {
    let p = Payload::from_bytes(cpu_gzip(), 1 << 20);
    let o = p.otlp().unwrap();
    let arrived = Payload::from_otlp(OtlpProfiles::new(
        o.dictionary.clone(),
        None,
        o.profiles.clone(),
        0,
    ));
    assert_eq!(arrived.arrived_as(), Format::Otlp);
    assert!(!arrived.is_converted());
    let both = arrived
        .with_form(Format::Pprof, &mut Lost::default())
        .unwrap();
    assert!(both.has(Format::Pprof));
    assert!(!both.is_decoded(), "converting is not decoding pprof bytes");
    let back = both.decoded().unwrap();
    assert_eq!(back.sample[0].value, vec![5]);
    assert_eq!(
        both.size_bytes(),
        arrived.size_bytes() + both.encoded().unwrap().bytes.len()
    );
}
