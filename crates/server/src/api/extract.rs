//! Extractors that answer bad input with typed JSON errors instead of axum's plain text.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use permit_core::{Name, SessionId};
use permit_wire::ErrorCode;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// A JSON body; rejections become `malformed_json`, `invalid_body`, `unsupported_media_type` or
/// `body_too_large`.
pub struct Json<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Json<T>, ApiError> {
        let axum::Json(value) = axum::Json::<T>::from_request(request, state).await?;
        Ok(Json(value))
    }
}

/// A query string; rejections become `invalid_argument`.
pub struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Query<T>, ApiError> {
        let axum::extract::Query(value) = axum::extract::Query::<T>::from_request_parts(parts, state).await?;
        Ok(Query(value))
    }
}

/// Parses a semaphore or election name from the path.
pub fn parse_name(text: &str) -> Result<Name, ApiError> {
    Name::new(text).map_err(|e| ApiError::new(ErrorCode::InvalidName, e.to_string()))
}

/// Parses a session id. A malformed id cannot name a session, so it is `session_not_found`.
pub fn parse_session(text: &str) -> Result<SessionId, ApiError> {
    text.parse().map_err(|_| ApiError::session_not_found())
}
