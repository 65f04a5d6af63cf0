//! The OpenAPI 3 spec, generated from the handlers and wire types. `docs/openapi.json` holds a
//! copy that a test keeps equal to this.

use permit_core::limits::NAME_BYTES_MAX;
use utoipa::openapi::link::LinkBuilder;
use utoipa::openapi::path::{Operation, ParameterIn};
use utoipa::openapi::schema::{Object, Schema};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi};

use super::{acl, cluster, elections, events, queues, semaphores, sessions, system};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Permit",
        description = "A distributed semaphore service: sessions, counting semaphores, leader elections, fencing tokens. \
Every error answers `{\"error\": {\"code\", \"message\"}}` with a stable snake_case code (see the ErrorCode schema). \
Limits: names 1-128 bytes of [A-Za-z0-9._:-]; ttl_ms 200..=86400000 (default 10000); capacity 1..=1000000; \
max_hold_ms 100..=604800000; election value at most 4096 bytes; wait_ms capped at 60000; bodies at most 64 KiB; \
at most 100000 waiters per semaphore and 10000 holds plus waits per session; at most 1024 session ids per batched keepalive. \
With `permit serve --auth`, every route but /v1/health and /v1/openapi.json needs `Authorization: Bearer SECRET` \
(401 `unauthenticated` without a valid token, 403 `permission_denied` without the permission; see docs/security.md), \
and a session can be used only with the token that created it. \
Without `--auth`, a request whose `Host` is neither `localhost` nor an IP address is answered 421 `misdirected_request` \
(DNS rebinding; /v1/health excepted). A body must arrive whole within the header-read timeout after its head \
(408 `body_timeout`). \
Every answer names the node that answered in `permit-node` (after forwarding: the leader) and its Raft term in \
`permit-raft-term`, and, when that node knows one, the leader's URL in `permit-leader`: a client given several \
nodes may send its requests there, saving the hop a follower forwards them over.",
        license(name = "Apache-2.0"),
    ),
    paths(
        sessions::create, sessions::list, sessions::keepalive, sessions::keepalive_batch, sessions::get, sessions::close,
        semaphores::list, semaphores::put, semaphores::get, semaphores::delete,
        semaphores::acquire, semaphores::release, semaphores::take, semaphores::validate, semaphores::revoke, semaphores::history,
        elections::list, elections::campaign, elections::proclaim, elections::get, elections::resign, elections::revoke,
        queues::list, queues::put, queues::get, queues::delete, queues::push, queues::items, queues::claim, queues::cancel_claim,
        queues::ack, queues::nack, queues::remove_item,
        acl::create, acl::list, acl::current, acl::delete,
        cluster::status, cluster::snapshot, cluster::init, cluster::add, cluster::remove,
        system::health, system::live, system::metrics, system::digest, events::events,
    ),
    components(schemas(permit_wire::ErrorCode, permit_wire::ErrorBody)),
    modifiers(&BearerAuth, &CommonErrors, &NameParameters, &OperationIds, &Links, &SessionIds),
    security((), ("bearer" = [])),
    tags(
        (name = "sessions", description = "Client liveness: a session's holds and waits end when it expires or closes."),
        (name = "semaphores", description = "Named counting semaphores with strict FIFO weighted queues and fencing tokens; \
policies beside the capacity (a rate, lock-delay, a cap per group) and rate-only takes need cluster feature version 5."),
        (name = "elections", description = "Leader election on a capacity-1 semaphore whose hold carries a value."),
        (name = "queues", description = "Durable work queues: items handed out in order, each claim a lease of the \
claiming session with a fencing token; at-least-once, with dead-lettering after `max_attempts` claims. Needs cluster \
feature version 4."),
        (name = "cluster", description = "Raft membership: status, init, add and remove nodes. Any node answers; \
followers forward writes and linearizable reads to the leader."),
        (name = "system", description = "Health and metrics."),
        (name = "events", description = "Server-Sent Events of applied state changes, served by every node from its own state."),
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

/// Regular expression of a semaphore or election name (see `permit_core::Name`).
pub const NAME_PATTERN: &str = "^[A-Za-z0-9._:-]+$";

/// Adds the error answers that come from the router, the extractors and the forwarding layer
/// rather than from a handler, so that every operation documents every status it can answer.
struct CommonErrors;

impl Modify for CommonErrors {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for (path, item) in openapi.paths.paths.iter_mut() {
            let operations = [&mut item.get, &mut item.put, &mut item.post, &mut item.delete];
            for operation in operations.into_iter().flatten() {
                add_common_errors(path, operation);
            }
        }
    }
}

/// Routes that need no token even with `--auth`.
const OPEN_PATHS: [&str; 3] = ["/v1/health", "/v1/health/live", "/v1/openapi.json"];

/// Routes that every node answers from its own state and that cannot fail.
const LOCAL_INFALLIBLE_PATHS: [&str; 3] = ["/v1/health", "/v1/debug/digest", "/metrics"];

fn add_common_errors(path: &str, operation: &mut Operation) {
    let has_body = operation.request_body.is_some();
    let has_params = operation.parameters.as_ref().is_some_and(|p| !p.is_empty());
    if has_body || has_params {
        add_error(
            operation,
            "400",
            "`malformed_json`, `invalid_name` or `invalid_argument` (the message names the field)",
        );
    }
    if path.contains('{') {
        add_error(operation, "404", "`not_found`: no route matches (e.g. an empty path segment)");
    }
    if has_body {
        add_error(operation, "413", "`body_too_large`: the body is larger than 64 KiB");
        add_error(
            operation,
            "415",
            "`unsupported_media_type`: the body needs `Content-Type: application/json`",
        );
        add_error(operation, "422", "`invalid_body`: not a JSON object of the request's schema");
        add_error(
            operation,
            "408",
            "`body_timeout`: the whole body did not arrive within the header-read timeout after the head; \
             the connection is closed",
        );
    }
    if !matches!(path, "/v1/health" | "/v1/health/live") {
        add_error(
            operation,
            "421",
            "`misdirected_request` (without `--auth`): the `Host` is neither `localhost` nor an IP address \
             (DNS rebinding); address the server by 127.0.0.1 or localhost",
        );
    }
    if !OPEN_PATHS.contains(&path) {
        add_error(
            operation,
            "401",
            "`unauthenticated` (with `--auth`): no valid `Authorization: Bearer SECRET`",
        );
        add_error(
            operation,
            "403",
            "`permission_denied` (with `--auth`): the token lacks the access, or the session is another token's",
        );
        add_error(
            operation,
            "429",
            "`limit_exceeded`: a limit or a per-token cap was reached; retry after `Retry-After` seconds",
        );
    }
    if !LOCAL_INFALLIBLE_PATHS.contains(&path) {
        add_error(operation, "500", "`internal`: a bug or an I/O failure on the server");
        add_error(
            operation,
            "503",
            "`no_leader`, `leader_unreachable`, `timeout` or `shutting_down`: retry (a write's outcome may be unknown)",
        );
    }
}

/// Adds an `ErrorBody` answer for `status` unless the handler documents that status itself.
fn add_error(operation: &mut Operation, status: &str, description: &str) {
    let responses = &mut operation.responses.responses;
    if responses.contains_key(status) {
        return;
    }
    let content = ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build();
    let response =
        ResponseBuilder::new().description(description).content("application/json", content).build();
    responses.insert(status.to_owned(), RefOr::T(response));
}

/// Constrains every `name` path parameter and the `after` query parameter to the name syntax.
struct NameParameters;

impl Modify for NameParameters {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for (path, item) in openapi.paths.paths.iter_mut() {
            let operations = [&mut item.get, &mut item.put, &mut item.post, &mut item.delete];
            for operation in operations.into_iter().flatten() {
                for parameter in operation.parameters.iter_mut().flatten() {
                    let is_name = match parameter.parameter_in {
                        ParameterIn::Path => parameter.name == "name",
                        // The session list pages by session id and the item list by item id,
                        // not by name.
                        ParameterIn::Query => {
                            parameter.name == "after"
                                && path != "/v1/sessions"
                                && path != "/v1/queues/{name}/items"
                        }
                        _ => false,
                    };
                    if let (true, Some(RefOr::T(Schema::Object(schema)))) =
                        (is_name, parameter.schema.as_mut())
                    {
                        constrain_name(schema);
                    }
                }
            }
        }
    }
}

fn constrain_name(schema: &mut Object) {
    schema.min_length = Some(1);
    schema.max_length = Some(NAME_BYTES_MAX);
    schema.pattern = Some(NAME_PATTERN.to_owned());
}

/// Regular expression of a session id (see `permit_core::SessionId`).
const SESSION_ID_PATTERN: &str = "^[0-9a-f]{32}$";

/// Constrains the ids of a batched keepalive to the session id syntax, each given once, as the
/// handler checks them.
struct SessionIds;

impl Modify for SessionIds {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let Some(components) = openapi.components.as_mut() else { return };
        let Some(RefOr::T(Schema::Object(request))) = components.schemas.get_mut("KeepaliveBatchRequest")
        else {
            return;
        };
        let Some(RefOr::T(Schema::Array(sessions))) = request.properties.get_mut("sessions") else { return };
        sessions.unique_items = true;
        if let utoipa::openapi::schema::ArrayItems::RefOrSchema(items) = &mut sessions.items {
            if let RefOr::T(Schema::Object(item)) = items.as_mut() {
                item.pattern = Some(SESSION_ID_PATTERN.to_owned());
            }
        }
    }
}

/// Makes operation ids unique (utoipa takes the handler's name, and three handlers are `get`):
/// `{tag}_{handler}`, e.g. `sessions_get`.
struct OperationIds;

impl Modify for OperationIds {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for item in openapi.paths.paths.values_mut() {
            let operations = [&mut item.get, &mut item.put, &mut item.post, &mut item.delete];
            for operation in operations.into_iter().flatten() {
                let tag = operation.tags.as_ref().and_then(|tags| tags.first()).cloned();
                if let (Some(tag), Some(id)) = (tag, operation.operation_id.as_mut()) {
                    *id = format!("{tag}_{id}");
                }
            }
        }
    }
}

/// Links from the answers that create a session or a semaphore to the operations that use its
/// id or name, so that clients (and the API fuzzer's stateful phase) can follow them.
struct Links;

impl Modify for Links {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let session_id = ("id", "$response.body#/id");
        link(
            openapi,
            "/v1/sessions",
            "201",
            &[
                ("sessions_get", session_id),
                ("sessions_keepalive", session_id),
                ("sessions_close", session_id),
            ],
        );
        let name = ("name", "$response.body#/name");
        link(
            openapi,
            "/v1/semaphores/{name}",
            "201",
            &[
                ("semaphores_get", name),
                ("semaphores_delete", name),
                ("semaphores_validate", name),
                ("semaphores_history", name),
            ],
        );
    }
}

/// Adds, to the `status` answer of the operation at `path` that creates something, a link to
/// each `(operation id, (parameter, runtime expression))` of `targets`.
fn link(openapi: &mut utoipa::openapi::OpenApi, path: &str, status: &str, targets: &[(&str, (&str, &str))]) {
    let Some(item) = openapi.paths.paths.get_mut(path) else { return };
    let creator = if path == "/v1/sessions" { item.post.as_mut() } else { item.put.as_mut() };
    let Some(RefOr::T(response)) = creator.and_then(|op| op.responses.responses.get_mut(status)) else {
        return;
    };
    for (operation_id, (parameter, expression)) in targets {
        let link = LinkBuilder::new().operation_id(*operation_id).parameter(*parameter, *expression).build();
        response.links.insert((*operation_id).to_owned(), RefOr::T(link));
    }
}

/// The spec as pretty JSON.
pub fn spec_json() -> String {
    let spec = ApiDoc::openapi().to_pretty_json().expect("spec serialises");
    // utoipa 5.5 spells unsigned integer formats `u-int64`; the usual spelling is `uint64`. (An
    // unsigned format keeps schema checkers from capping `u64` fields at `i64::MAX`.) It also
    // serialises a link's `operationId` as `operation_id`, which no tool reads.
    let mut spec = spec
        .replace("\"format\": \"u-int", "\"format\": \"uint")
        .replace("\"operation_id\": ", "\"operationId\": ");
    spec.push('\n');
    spec
}

/// `GET /v1/openapi.json`: the OpenAPI 3 spec of this API.
pub(crate) async fn spec() -> impl axum::response::IntoResponse {
    ([(axum::http::header::CONTENT_TYPE, "application/json")], spec_json())
}
