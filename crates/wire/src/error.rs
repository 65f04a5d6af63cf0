//! Error bodies and the stable list of error codes.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

/// Every error answer: `{"error": {"code": "...", "message": "..."}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// The code (stable, for programs) and message (for humans) of an error.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ErrorDetail {
    /// Stable snake_case code; see [`ErrorCode`].
    pub code: ErrorCode,
    /// What went wrong, for humans; may change between versions.
    pub message: String,
    /// With `rate_limited`: milliseconds until the rate allows the request (the `Retry-After`
    /// header carries it in whole seconds, rounded up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

macro_rules! error_codes {
    ($( $(#[$doc:meta])* $variant:ident = $text:literal, $status:literal; )+) => {
        /// Stable error codes. Codes are only ever added, never renamed or reused.
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum ErrorCode {
            $( $(#[$doc])* $variant, )+
            /// A code this version does not know (sent by a newer server).
            Unknown(String),
        }

        impl ErrorCode {
            /// Every known code, in the order they were added.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant),+];

            /// The code's text.
            pub fn as_str(&self) -> &str {
                match self {
                    $(ErrorCode::$variant => $text,)+
                    ErrorCode::Unknown(text) => text,
                }
            }

            /// The HTTP status the server answers with for this code.
            pub fn http_status(&self) -> u16 {
                match self {
                    $(ErrorCode::$variant => $status,)+
                    ErrorCode::Unknown(_) => 500,
                }
            }

            /// The code with this text, or [`ErrorCode::Unknown`].
            pub fn parse(text: &str) -> ErrorCode {
                match text {
                    $($text => ErrorCode::$variant,)+
                    other => ErrorCode::Unknown(other.to_owned()),
                }
            }
        }
    };
}

error_codes! {
    /// The body is not valid JSON.
    MalformedJson = "malformed_json", 400;
    /// The JSON does not match the request's schema: unknown field, wrong type, missing field.
    InvalidBody = "invalid_body", 422;
    /// The request needs `Content-Type: application/json`.
    UnsupportedMediaType = "unsupported_media_type", 415;
    /// The body is larger than 64 KiB.
    BodyTooLarge = "body_too_large", 413;
    /// A semaphore or election name is not 1-128 bytes of `[A-Za-z0-9._:-]`.
    InvalidName = "invalid_name", 400;
    /// A number or string is outside its documented range; the message names the field.
    InvalidArgument = "invalid_argument", 400;
    /// No route matches the path.
    NotFound = "not_found", 404;
    /// The route exists but not with this method.
    MethodNotAllowed = "method_not_allowed", 405;
    /// The session does not exist: never created, closed, or expired.
    SessionNotFound = "session_not_found", 404;
    /// The semaphore does not exist (an acquire may create it by passing `capacity`).
    SemaphoreNotFound = "semaphore_not_found", 404;
    /// A try-acquire found too few free permits, or others waiting first.
    Unavailable = "unavailable", 409;
    /// More permits asked for than the semaphore's capacity.
    PermitsExceedCapacity = "permits_exceed_capacity", 409;
    /// The session already holds or waits for a different number of permits here.
    PermitsMismatch = "permits_mismatch", 409;
    /// The semaphore has holders or waiters and cannot be deleted.
    SemaphoreBusy = "semaphore_busy", 409;
    /// The wait ended without a grant: the session released it, or the capacity shrank below it.
    WaitCancelled = "wait_cancelled", 409;
    /// A documented limit (sessions, objects, waiters, holds per session, sessions or long-polls
    /// per token) was reached. The answer carries `Retry-After`.
    LimitExceeded = "limit_exceeded", 429;
    /// No leader is reachable (election in progress, or no quorum). A write's outcome is
    /// unknown: retry it (acquire is idempotent per session and semaphore).
    NoLeader = "no_leader", 503;
    /// The server is shutting down.
    ShuttingDown = "shutting_down", 503;
    /// A bug or an I/O failure on the server.
    Internal = "internal", 500;
    /// The write was not committed in time (no quorum?). Its outcome is unknown: retry it.
    Timeout = "timeout", 503;
    /// `POST /v1/cluster/init` on a node that already belongs to a cluster.
    AlreadyInitialized = "already_initialized", 409;
    /// Another membership change is still in progress; retry when it is done.
    MembershipChangeInProgress = "membership_change_in_progress", 409;
    /// This node could not deliver the request to a leader (none elected, or it did not accept
    /// the connection): nothing was done. Retry, here or on another node.
    LeaderUnreachable = "leader_unreachable", 503;
    /// Auth is on and the request has no valid `Authorization: Bearer SECRET` (missing,
    /// malformed, or an unknown or deleted token).
    Unauthenticated = "unauthenticated", 401;
    /// The token lacks the permission the message names, or the session belongs to another
    /// token.
    PermissionDenied = "permission_denied", 403;
    /// The access token does not exist.
    TokenNotFound = "token_not_found", 404;
    /// A write to this node's data dir failed (disk full, I/O error): it refuses all work and
    /// exits. Nothing it acknowledged is lost; retry on another node.
    StorageError = "storage_error", 503;
    /// Plain HTTP was sent to a port that serves HTTPS only; the connection is closed.
    TlsRequired = "tls_required", 400;
    /// Auth is off and the request's `Host` is not this machine (`localhost`) or an IP
    /// address: a name that may point here by DNS rebinding. Use `http://127.0.0.1:PORT` or
    /// `http://localhost:PORT`, or start the server with `--auth`.
    MisdirectedRequest = "misdirected_request", 421;
    /// The request's body did not arrive whole within the header-read timeout after its head
    /// (a client that trickles or withholds it); nothing was done and the connection is closed.
    BodyTimeout = "body_timeout", 408;
    /// The request needs a newer cluster feature version than the cluster has agreed on: a
    /// member still runs an older build (the message names it). Nothing was written; it works
    /// once every member is upgraded (docs/operations.md, *Upgrading*).
    FeatureUnavailable = "feature_unavailable", 409;
    /// A Raft message from a node of another cluster: a member of the cluster that `permit
    /// recover` replaced, or a node with data of its own added to a recovered one. The message
    /// says which node's data dir to wipe before it is added back.
    WrongCluster = "wrong_cluster", 409;
    /// A proclaim (or a campaign that changes the value) by a session that does not lead the
    /// election: another session leads, or none does. Nothing changed.
    NotLeader = "not_leader", 409;
    /// The queue does not exist (a push creates it; other calls do not).
    QueueNotFound = "queue_not_found", 404;
    /// The queue still holds items or blocked claimers and cannot be deleted.
    QueueBusy = "queue_busy", 409;
    /// The queue holds `max_items` items: the push added nothing.
    QueueFull = "queue_full", 409;
    /// An item's payload is larger than 64 KiB encoded: the push added nothing.
    PayloadTooLarge = "payload_too_large", 413;
    /// The session or token no longer owns the item's claim (the claim ended: its session
    /// ended, it was acked or nacked, or it was claimed again since): nothing changed.
    ClaimLost = "claim_lost", 409;
    /// The queue has no item with this id (never pushed, acked, dead-lettered or removed).
    ItemNotFound = "item_not_found", 404;
    /// A take (or a take's wait) found no room in the semaphore's rate: nothing was taken.
    /// `retry_after_ms` says when the rate allows it.
    RateLimited = "rate_limited", 429;
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for ErrorCode {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .enum_values(Some(ErrorCode::ALL.iter().map(ErrorCode::as_str)))
            .description(Some("Stable error code: codes are only ever added, never renamed or reused."))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl ToSchema for ErrorCode {}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<ErrorCode, D::Error> {
        let text = String::deserialize(deserializer)?;
        Ok(ErrorCode::parse(&text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Codes are part of the API: this list only ever grows.
    const PUBLISHED: &str = "malformed_json invalid_body unsupported_media_type body_too_large \
        invalid_name invalid_argument not_found method_not_allowed session_not_found \
        semaphore_not_found unavailable permits_exceed_capacity permits_mismatch semaphore_busy \
        wait_cancelled limit_exceeded no_leader shutting_down internal timeout already_initialized \
        membership_change_in_progress leader_unreachable unauthenticated permission_denied \
        token_not_found storage_error tls_required misdirected_request body_timeout \
        feature_unavailable wrong_cluster not_leader queue_not_found queue_busy queue_full \
        payload_too_large claim_lost item_not_found rate_limited";

    #[test]
    fn error_codes_match_the_published_list() {
        let codes: Vec<&str> = ErrorCode::ALL.iter().map(ErrorCode::as_str).collect();
        assert_eq!(codes, PUBLISHED.split_whitespace().collect::<Vec<_>>());
        for code in ErrorCode::ALL {
            assert_eq!(&ErrorCode::parse(code.as_str()), code);
            assert!((400..600).contains(&code.http_status()));
        }
    }

    #[test]
    fn unknown_codes_survive_a_round_trip() {
        let body: ErrorBody =
            serde_json::from_str(r#"{"error":{"code":"from_the_future","message":"m"}}"#).unwrap();
        assert_eq!(body.error.code, ErrorCode::Unknown("from_the_future".into()));
        assert!(serde_json::to_string(&body).unwrap().contains("from_the_future"));
    }
}
