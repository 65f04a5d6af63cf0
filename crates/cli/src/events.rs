//! `permit events`: print a node's event stream, one line per event.

use anyhow::Context;
use permit_client::{Client, EventsOptions};

/// `permit events [--prefix P] [--kinds k1,k2] [--json] [--after SEQ] [--count N]`
#[derive(clap::Args, Debug)]
#[command(after_help = crate::EXIT_CODES_COMMON)]
pub struct EventsArgs {
    /// Only events of semaphores and elections whose name starts with this (session events are
    /// shown only without a prefix).
    #[arg(long)]
    pub prefix: Option<String>,
    /// Only these kinds, comma-separated: session_created, session_expired, session_closed,
    /// queued, granted, released, wait_ended, expired, revoked, capacity_changed, leader_changed,
    /// proclaimed, taken, rate_limited, delay_ended.
    #[arg(long, value_delimiter = ',')]
    pub kinds: Vec<String>,
    /// Print each event's JSON (one object per line) instead of a summary.
    #[arg(long)]
    pub json: bool,
    /// Start after this event seq (as a reconnecting client would); default: new events only.
    #[arg(long)]
    pub after: Option<u64>,
    /// Exit after this many events (default: follow until interrupted).
    #[arg(long)]
    pub count: Option<u64>,
}

/// Runs `permit events`.
pub(crate) async fn events(client: &Client, args: EventsArgs) -> anyhow::Result<i32> {
    let options = EventsOptions { prefix: args.prefix, kinds: args.kinds, after: args.after };
    let mut stream = client.events(options).await.context("cannot open the event stream")?;
    let mut printed = 0;
    while args.count.is_none_or(|count| printed < count) {
        let Some(event) = stream.next().await.context("the event stream broke")? else { break };
        if args.json {
            println!("{}", event.data);
        } else {
            println!("{}", summary(&event.kind, &event.data));
        }
        printed += 1;
    }
    Ok(0)
}

/// One line: `seq index kind [object name] [session] [field=value...]`.
fn summary(kind: &str, data: &serde_json::Value) -> String {
    if kind == "missed" {
        return format!(
            "missed: events from {} on are gone; resuming at {}",
            data["requested"], data["first_available"]
        );
    }
    let mut line = format!("{} @{} {kind}", data["seq"], data["index"]);
    if let (Some(object), Some(name)) = (data["object_kind"].as_str(), data["name"].as_str()) {
        line.push_str(&format!(" {object} {name}"));
    }
    match (data["session"].as_str(), data["session_name"].as_str()) {
        (Some(id), Some(name)) => line.push_str(&format!(" session={name}({id})")),
        (Some(id), None) => line.push_str(&format!(" session={id}")),
        _ => {}
    }
    for field in ["permits", "token", "capacity", "value", "reason"] {
        match &data[field] {
            serde_json::Value::Null => {}
            serde_json::Value::String(text) => line.push_str(&format!(" {field}={text}")),
            other => line.push_str(&format!(" {field}={other}")),
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn a_summary_names_the_object_session_and_fields() {
        let data = json!({"seq":42,"index":1234,"now_ms":1,"kind":"granted","object_kind":"semaphore",
            "name":"gpu","session":"ab","session_name":"worker-1","permits":2,"token":17});
        assert_eq!(
            super::summary("granted", &data),
            "42 @1234 granted semaphore gpu session=worker-1(ab) permits=2 token=17"
        );
        let missed = json!({"requested": 5, "first_available": 9});
        assert_eq!(super::summary("missed", &missed), "missed: events from 5 on are gone; resuming at 9");
    }
}
