//! `/v1/acl/tokens`: create, list, inspect and delete access tokens (with `--auth`).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use permit_core::{validate_token, Access, Command, Outcome, Resource, Rule, Token, TokenId, ROOT_TOKEN_ID};
use permit_wire::{
    AclAccess, AclResource, AclRule, CreateTokenRequest, ErrorBody, ErrorCode, TokenCreated, TokenList,
    TokenView,
};

use super::app::App;
use super::extract::Json;
use crate::auth::{new_secret, secret_hash, Caller};
use crate::error::ApiError;

/// Attempts to draw an unused token id; a collision of 128 random bits is a broken RNG.
const TOKEN_ID_ATTEMPTS: usize = 3;

/// Create a token. The answer is the only time its secret is shown; the server keeps only a
/// salted hash of it (HMAC-SHA256 under the cluster's token salt). Needs `acl` admin.
#[utoipa::path(post, path = "/v1/acl/tokens", tag = "acl", request_body = CreateTokenRequest,
    responses((status = 201, body = TokenCreated)))]
pub(crate) async fn create(
    State(app): State<Arc<App>>,
    Json(request): Json<CreateTokenRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let rules: Vec<Rule> = request.rules.iter().map(rule_from_wire).collect();
    validate_token(&request.name, &rules)?;
    for _ in 0..TOKEN_ID_ATTEMPTS {
        let id = app.new_token_id();
        if id == ROOT_TOKEN_ID {
            continue;
        }
        let secret = new_secret();
        // The salt never changes once set; a cluster without one yet (made before salts, its
        // first leader with this code not yet applied) stores the plain SHA-256, which the
        // lookup still finds.
        let salt = app.replica().read().state.token_salt().copied();
        let secret_hash = secret_hash(salt.as_ref(), &secret);
        let token = Token { name: request.name.clone(), secret_hash, rules: rules.clone() };
        match app.propose(Command::CreateToken { id, token }).await? {
            Outcome::TokenCreated => {
                let created =
                    TokenCreated { id: id.to_string(), name: request.name, secret, rules: request.rules };
                return Ok((StatusCode::CREATED, axum::Json(created)));
            }
            Outcome::Refused(permit_core::Refusal::TokenExists) => continue,
            Outcome::Refused(refusal) => return Err(refusal.into()),
            other => return Err(ApiError::internal(other)),
        }
    }
    Err(ApiError::internal("token id collisions"))
}

/// Every token, without secrets. Needs `acl` read.
#[utoipa::path(get, path = "/v1/acl/tokens", tag = "acl",
    responses((status = 200, body = TokenList)))]
pub(crate) async fn list(State(app): State<Arc<App>>) -> Result<axum::Json<TokenList>, ApiError> {
    app.ensure_linearizable().await?;
    let replica = app.replica().read();
    let state = &replica.state;
    let tokens = state.tokens().map(|(id, token)| view(*id, token, state.sessions_of(*id))).collect();
    Ok(axum::Json(TokenList { tokens }))
}

/// The token the request was made with. Any valid token may ask.
#[utoipa::path(get, path = "/v1/acl/tokens/self", tag = "acl",
    responses((status = 200, body = TokenView),
              (status = 400, body = ErrorBody, description = "`invalid_argument`: auth is off, requests carry no token")))]
pub(crate) async fn current(
    State(app): State<Arc<App>>,
    caller: Caller,
) -> Result<axum::Json<TokenView>, ApiError> {
    match caller {
        Caller::Anyone => {
            Err(ApiError::new(ErrorCode::InvalidArgument, "auth is off: requests carry no token"))
        }
        Caller::Token { id, token } => {
            let sessions = app.replica().read().state.sessions_of(id);
            Ok(axum::Json(view(id, &token, sessions)))
        }
    }
}

/// Delete a token: from the moment it is applied, every node refuses it, and every session it
/// created is closed (holds released, waits cancelled). Needs `acl` admin.
#[utoipa::path(delete, path = "/v1/acl/tokens/{id}", tag = "acl",
    params(("id" = String, Path, description = "Token id (32 hex digits)")),
    responses((status = 204)))]
pub(crate) async fn delete(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let id: TokenId = id.parse().map_err(|_| token_not_found())?;
    match app.propose(Command::DeleteToken { id }).await? {
        Outcome::TokenDeleted { sessions_closed } => {
            tracing::info!(token = %id, sessions_closed, "token deleted");
            Ok(StatusCode::NO_CONTENT)
        }
        Outcome::Refused(refusal) => Err(refusal.into()),
        other => Err(ApiError::internal(other)),
    }
}

fn token_not_found() -> ApiError {
    ApiError::new(ErrorCode::TokenNotFound, "no token with this id (ids are 32 hex digits)")
}

fn view(id: TokenId, token: &Token, sessions: u64) -> TokenView {
    TokenView {
        id: id.to_string(),
        name: token.name.clone(),
        rules: token.rules.iter().map(rule_to_wire).collect(),
        sessions,
    }
}

fn rule_from_wire(rule: &AclRule) -> Rule {
    let resource = match rule.resource {
        AclResource::Semaphore => Resource::Semaphore,
        AclResource::Election => Resource::Election,
        AclResource::Session => Resource::Session,
        AclResource::Acl => Resource::Acl,
        AclResource::Cluster => Resource::Cluster,
        AclResource::Queue => Resource::Queue,
    };
    let access = match rule.access {
        AclAccess::Read => Access::Read,
        AclAccess::Write => Access::Write,
        AclAccess::Admin => Access::Admin,
    };
    Rule { resource, prefix: rule.prefix.clone(), access }
}

fn rule_to_wire(rule: &Rule) -> AclRule {
    let resource = match rule.resource {
        Resource::Semaphore => AclResource::Semaphore,
        Resource::Election => AclResource::Election,
        Resource::Session => AclResource::Session,
        Resource::Acl => AclResource::Acl,
        Resource::Cluster => AclResource::Cluster,
        Resource::Queue => AclResource::Queue,
    };
    let access = match rule.access {
        Access::Read => AclAccess::Read,
        Access::Write => AclAccess::Write,
        Access::Admin => AclAccess::Admin,
    };
    AclRule { resource, prefix: rule.prefix.clone(), access }
}
