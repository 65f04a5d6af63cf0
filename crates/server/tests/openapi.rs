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

/// The limits the spec declares (as literals in the wire types' schema attributes) are the
/// limits the server enforces (the constants of `permit_core::limits`).
#[test]
fn the_spec_declares_the_enforced_limits() {
    use permit_core::limits::*;
    let spec: serde_json::Value = serde_json::from_str(&permit_server::api::openapi::spec_json()).unwrap();
    let schemas = &spec["components"]["schemas"];
    let field = |schema: &str, field: &str| schemas[schema]["properties"][field].clone();
    let range = |schema: &str, name: &str| {
        let value = field(schema, name);
        (value["minimum"].as_u64(), value["maximum"].as_u64())
    };
    assert_eq!(range("PutSemaphoreRequest", "capacity"), (Some(1), Some(SEMAPHORE_CAPACITY_MAX)));
    assert_eq!(range("AcquireRequest", "capacity"), (Some(1), Some(SEMAPHORE_CAPACITY_MAX)));
    assert_eq!(range("AcquireRequest", "permits"), (Some(1), Some(SEMAPHORE_CAPACITY_MAX)));
    assert_eq!(range("AcquireRequest", "max_hold_ms"), (Some(MAX_HOLD_MS_MIN), Some(MAX_HOLD_MS_MAX)));
    assert_eq!(range("CreateSessionRequest", "ttl_ms"), (Some(SESSION_TTL_MS_MIN), Some(SESSION_TTL_MS_MAX)));
    let max_length = |schema: &str, name: &str| field(schema, name)["maxLength"].as_u64();
    assert_eq!(max_length("CreateSessionRequest", "name"), Some(SESSION_NAME_BYTES_MAX as u64));
    assert_eq!(max_length("CampaignRequest", "value"), Some(ELECTION_VALUE_BYTES_MAX as u64));
    assert_eq!(max_length("ProclaimRequest", "value"), Some(ELECTION_VALUE_BYTES_MAX as u64));
    assert_eq!(range("PutQueueRequest", "max_attempts"), (Some(1), Some(QUEUE_MAX_ATTEMPTS_MAX as u64)));
    assert_eq!(range("PutQueueRequest", "max_items"), (Some(1), Some(QUEUE_ITEMS_MAX)));
    assert_eq!(range("ClaimRequest", "max"), (Some(1), Some(QUEUE_CLAIM_ITEMS_MAX as u64)));
    assert_eq!(range("NackRequest", "delay_ms"), (Some(0), Some(QUEUE_DELAY_MS_MAX)));
    assert_eq!(range("PutSemaphoreRequest", "lock_delay_ms"), (Some(0), Some(LOCK_DELAY_MS_MAX)));
    assert_eq!(range("Rate", "permits"), (Some(1), Some(RATE_PERMITS_MAX)));
    assert_eq!(range("Rate", "per_ms"), (Some(1), Some(RATE_PER_MS_MAX)));
    assert_eq!(range("Rate", "burst"), (Some(1), Some(RATE_PERMITS_MAX)));
    assert_eq!(range("TakeRequest", "permits"), (Some(1), Some(RATE_PERMITS_MAX)));
    let mut names = 0;
    for (path, item) in spec["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            for parameter in operation["parameters"].as_array().into_iter().flatten() {
                let session_page = (path == "/v1/sessions" || path == "/v1/queues/{name}/items")
                    && parameter["name"] == "after";
                if (parameter["name"] == "name" || parameter["name"] == "after") && !session_page {
                    let schema = &parameter["schema"];
                    assert_eq!(schema["maxLength"].as_u64(), Some(NAME_BYTES_MAX as u64), "{method} {path}");
                    assert_eq!(
                        schema["pattern"],
                        permit_server::api::openapi::NAME_PATTERN,
                        "{method} {path}"
                    );
                    names += 1;
                }
                let query = ["index", "wait_ms", "stale", "after", "limit"];
                if query.contains(&parameter["name"].as_str().unwrap_or_default()) {
                    assert_eq!(parameter["in"], "query", "{method} {path}: {parameter}");
                }
            }
        }
    }
    assert_eq!(
        names, 27,
        "twenty-four `{{name}}` path parameters and the `after` of the semaphore, election and queue lists"
    );
}
