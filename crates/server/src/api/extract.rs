//! Extractors that answer bad input with typed JSON errors instead of axum's plain text.

use std::fmt;
use std::marker::PhantomData;

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use permit_core::{Name, SessionId};
use permit_wire::ErrorCode;
use serde::de::{DeserializeOwned, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use crate::error::ApiError;

/// A JSON object body; rejections become `malformed_json`, `invalid_body`,
/// `unsupported_media_type` or `body_too_large`. Any other JSON value (an array, which serde
/// would otherwise read as a struct's fields in order, a number, `null`) is `invalid_body`.
pub(crate) struct Json<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Json<T>, ApiError> {
        let axum::Json(Object(value)) = axum::Json::<Object<T>>::from_request(request, state).await?;
        Ok(Json(value))
    }
}

/// A `T` that deserializes only from a JSON object.
struct Object<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Object<T>, D::Error> {
        deserializer.deserialize_map(ObjectVisitor(PhantomData))
    }
}

struct ObjectVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
    type Value = Object<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Object<T>, A::Error> {
        T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Object)
    }
}

/// A path parameter as text; a segment that is not UTF-8 once percent-decoded is
/// `invalid_argument` (axum would answer plain text).
pub(crate) struct Path<T>(pub(crate) T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Path<T>, ApiError> {
        let axum::extract::Path(value) = axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map_err(|rejection| ApiError::new(ErrorCode::InvalidArgument, rejection.body_text()))?;
        Ok(Path(value))
    }
}

/// A query string; rejections become `invalid_argument`.
pub(crate) struct Query<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Query<T>, ApiError> {
        let axum::extract::Query(value) = axum::extract::Query::<T>::from_request_parts(parts, state).await?;
        Ok(Query(value))
    }
}

/// Parses a semaphore or election name from the path.
pub(crate) fn parse_name(text: &str) -> Result<Name, ApiError> {
    Name::new(text).map_err(|e| ApiError::new(ErrorCode::InvalidName, e.to_string()))
}

/// Parses a session id. A malformed id cannot name a session, so it is `session_not_found`.
pub(crate) fn parse_session(text: &str) -> Result<SessionId, ApiError> {
    text.parse().map_err(|_| ApiError::session_not_found())
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> ApiError {
        if crate::listener::is_body_timeout(&rejection) {
            return ApiError::body_timeout();
        }
        let message = rejection.body_text();
        let code = match rejection {
            JsonRejection::JsonSyntaxError(_) => ErrorCode::MalformedJson,
            JsonRejection::JsonDataError(_) => ErrorCode::InvalidBody,
            JsonRejection::MissingJsonContentType(_) => ErrorCode::UnsupportedMediaType,
            JsonRejection::BytesRejection(ref bytes) if bytes.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                ErrorCode::BodyTooLarge
            }
            _ => ErrorCode::InvalidBody,
        };
        ApiError::new(code, message)
    }
}
