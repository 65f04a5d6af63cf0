//! The OpenAPI 3 spec, generated from the handlers and wire types. `docs/openapi.json` holds a
//! copy that a test keeps equal to this.

use utoipa::OpenApi;

use super::{acl, cluster, elections, semaphores, sessions, system};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Permit",
        description = "A distributed semaphore service: sessions, counting semaphores, leader elections, fencing tokens. \
Every error answers `{\"error\": {\"code\", \"message\"}}` with a stable snake_case code (see the ErrorCode schema). \
Limits: names 1-128 bytes of [A-Za-z0-9._:-]; ttl_ms 200..=86400000 (default 10000); capacity 1..=1000000; \
max_hold_ms 100..=604800000; election value at most 4096 bytes; wait_ms capped at 60000; bodies at most 64 KiB; \
at most 100000 waiters per semaphore and 10000 holds plus waits per session. \
With `permit serve --auth`, every route but /v1/health and /v1/openapi.json needs `Authorization: Bearer SECRET` \
(401 `unauthenticated` without a valid token, 403 `permission_denied` without the permission; see docs/security.md), \
and a session can be used only with the token that created it.",
        license(name = "Apache-2.0"),
    ),
    paths(
        sessions::create, sessions::list, sessions::keepalive, sessions::get, sessions::close,
        semaphores::list, semaphores::put, semaphores::get, semaphores::delete,
        semaphores::acquire, semaphores::release, semaphores::validate, semaphores::revoke,
        elections::campaign, elections::get, elections::resign, elections::revoke,
        acl::create, acl::list, acl::current, acl::delete,
        cluster::status, cluster::init, cluster::add, cluster::remove,
        system::health, system::live, system::metrics, system::digest,
    ),
    components(schemas(permit_wire::ErrorCode)),
    modifiers(&BearerAuth),
    security((), ("bearer" = [])),
    tags(
        (name = "sessions", description = "Client liveness: a session's holds and waits end when it expires or closes."),
        (name = "semaphores", description = "Named counting semaphores with strict FIFO weighted queues and fencing tokens."),
        (name = "elections", description = "Leader election on a capacity-1 semaphore whose hold carries a value."),
        (name = "cluster", description = "Raft membership: status, init, add and remove nodes. Any node answers; \
followers forward writes and linearizable reads to the leader."),
        (name = "system", description = "Health and metrics."),
        (name = "acl", description = "Access tokens with per-prefix rules (`permit serve --auth`)."),
    )
)]
struct ApiDoc;

/// Declares the bearer-token scheme that `--auth` uses.
struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, spec: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
        let components = spec.components.get_or_insert_with(Default::default);
        components.add_security_scheme("bearer", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
    }
}

/// The spec as pretty JSON.
pub fn spec_json() -> String {
    let mut spec = ApiDoc::openapi().to_pretty_json().expect("spec serialises");
    spec.push('\n');
    spec
}
