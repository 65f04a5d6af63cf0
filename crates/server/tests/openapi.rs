//! Keeps `docs/openapi.json` equal to the spec generated from the code.
//! Run with `PERMIT_UPDATE_OPENAPI=1` to rewrite the file after an API change.

#[test]
fn committed_openapi_spec_matches_the_code() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
    let generated = permit_server::api::openapi::spec_json();
    if std::env::var_os("PERMIT_UPDATE_OPENAPI").is_some() {
        std::fs::write(path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(committed == generated, "docs/openapi.json is stale: rerun with PERMIT_UPDATE_OPENAPI=1");
}
