//! `ApiError`: every error answer of the HTTP API, with its status and stable code. It sits below
//! `api/`, because the authorisation rules (`auth`) and the listener answer with it too.

use axum::extract::rejection::QueryRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use permit_core::{Limit, Refusal};
use permit_wire::{ErrorBody, ErrorCode, ErrorDetail};

/// What to do about a missing semaphore, in every `semaphore_not_found` message.
pub(crate) const SEMAPHORE_NOT_FOUND_HINT: &str =
    "create it with PUT /v1/semaphores/{name} {\"capacity\": N} \
(`permit set-capacity NAME N`), or pass \"capacity\" with the acquire to create it on first use";

/// An error answer: `{"error": {"code", "message"}}` with the code's HTTP status.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    /// Stable code.
    pub(crate) code: ErrorCode,
    /// Message for humans.
    pub(crate) message: String,
    /// With `rate_limited`: when the rate allows the request, in ms (also `Retry-After`).
    pub(crate) retry_after_ms: Option<u64>,
}

impl ApiError {
    /// An error with this code and message.
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError { code, message: message.into(), retry_after_ms: None }
    }

    /// `rate_limited`, allowed again in `retry_after_ms`.
    pub(crate) fn rate_limited(message: impl Into<String>, retry_after_ms: u64) -> ApiError {
        ApiError { retry_after_ms: Some(retry_after_ms), ..ApiError::new(ErrorCode::RateLimited, message) }
    }

    /// `session_not_found`.
    pub(crate) fn session_not_found() -> ApiError {
        ApiError::new(ErrorCode::SessionNotFound, "session not found (never created, closed, or expired)")
    }

    /// `body_timeout`: the body did not arrive in time (`listener::DeadlineBody`).
    pub(crate) fn body_timeout() -> ApiError {
        ApiError::new(
            ErrorCode::BodyTimeout,
            "the request body did not arrive whole within the header-read timeout after its head; \
             nothing was done",
        )
    }

    /// `internal`, for outcomes that cannot happen.
    pub(crate) fn internal(what: impl std::fmt::Debug) -> ApiError {
        tracing::error!(?what, "internal error");
        ApiError::new(ErrorCode::Internal, format!("internal error: {what:?}"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let retry_after_ms = self.retry_after_ms;
        let body =
            ErrorBody { error: ErrorDetail { code: self.code, message: self.message, retry_after_ms } };
        let mut response = (status, axum::Json(body)).into_response();
        if let Some(ms) = retry_after_ms {
            // Whole seconds, rounded up, so that a client that honours only the header is never early.
            let seconds = ms.div_ceil(1000).max(1);
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, seconds.into());
        }
        response
    }
}

impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> ApiError {
        let message = refusal.to_string();
        let code = match refusal {
            Refusal::SessionNotFound => return ApiError::session_not_found(),
            Refusal::SessionExists => ErrorCode::Internal,
            Refusal::SemaphoreNotFound => {
                return ApiError::new(
                    ErrorCode::SemaphoreNotFound,
                    format!("{message}: {SEMAPHORE_NOT_FOUND_HINT}"),
                )
            }
            Refusal::Unavailable => ErrorCode::Unavailable,
            Refusal::PermitsExceedCapacity { .. } => ErrorCode::PermitsExceedCapacity,
            Refusal::PermitsMismatch { .. } => ErrorCode::PermitsMismatch,
            Refusal::SemaphoreBusy => ErrorCode::SemaphoreBusy,
            Refusal::InvalidArgument { .. } => ErrorCode::InvalidArgument,
            Refusal::LimitExceeded(
                Limit::Sessions
                | Limit::Objects
                | Limit::WaitersPerObject
                | Limit::KeysPerSession
                | Limit::Tokens
                | Limit::SessionsPerToken
                | Limit::ObjectsPerToken,
            ) => ErrorCode::LimitExceeded,
            Refusal::TokenNotFound => ErrorCode::TokenNotFound,
            Refusal::TokenExists => ErrorCode::Internal,
            Refusal::FeatureUnavailable { .. } => ErrorCode::FeatureUnavailable,
            Refusal::NotLeader => ErrorCode::NotLeader,
            Refusal::QueueNotFound => ErrorCode::QueueNotFound,
            Refusal::QueueBusy => ErrorCode::QueueBusy,
            Refusal::QueueFull { .. } => ErrorCode::QueueFull,
            Refusal::PayloadTooLarge { .. } => ErrorCode::PayloadTooLarge,
            Refusal::ClaimLost => ErrorCode::ClaimLost,
            Refusal::ItemNotFound => ErrorCode::ItemNotFound,
            Refusal::LimitExceeded(Limit::Queues | Limit::Items | Limit::ClaimsPerSession) => {
                ErrorCode::LimitExceeded
            }
            Refusal::RateLimited { retry_after_ms } => {
                return ApiError::rate_limited(message, retry_after_ms)
            }
        };
        ApiError::new(code, message)
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> ApiError {
        ApiError::new(ErrorCode::InvalidArgument, rejection.body_text())
    }
}
