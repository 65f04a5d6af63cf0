//! Times what a restart does with a large snapshot: encode, decode, check invariants.
//!
//! ```sh
//! cargo run --release -p permit-core --example snapshot_load -- 1000000
//! ```
//! Builds a state of N sessions, each holding one permit of one of 1 000 semaphores (the
//! benchmark's `big` shape), through `State::apply`.

use std::time::Instant;

use permit_core::{Acquire, Batch, Command, Key, Name, SessionId, State};

fn main() {
    let n: usize = std::env::args().nth(1).map_or(1_000_000, |a| a.parse().expect("a number"));
    let started = Instant::now();
    let mut state = State::default();
    let mut effects = Vec::new();
    let mut index = 0;
    let names: Vec<Name> = (0..1000).map(|i| Name::new(format!("b-{i}")).expect("valid name")).collect();
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let mut commands = Vec::with_capacity(2 * chunk.len());
        for &i in chunk {
            let mut bytes = [0u8; 16];
            bytes[..8].copy_from_slice(&(i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes());
            bytes[8..].copy_from_slice(&(i as u64).to_le_bytes());
            let id = SessionId::from_bytes(bytes);
            commands.push(Command::CreateSession { id, ttl_ms: 86_400_000, name: None });
            commands.push(Command::Acquire(Acquire {
                key: Key::semaphore(names[i % names.len()].clone()),
                session: id,
                permits: 1,
                wait: false,
                capacity: Some(1_000_000),
                max_hold_ms: None,
                value: None,
            }));
        }
        index += 1;
        state.apply(index, 1, &Batch { now_ms: index, commands }, &mut effects);
        effects.clear();
    }
    println!("build {n} sessions: {:?}", started.elapsed());
    let started = Instant::now();
    let bytes = state.encode_snapshot();
    println!("encode: {:?} ({} bytes)", started.elapsed(), bytes.len());
    // What the shell does under its lock now: freeze a view. Then a write to the state while
    // the view lives copies the paths it touches.
    let started = Instant::now();
    let view = state.snapshot_view();
    println!("snapshot view (under the lock): {:?}", started.elapsed());
    let started = Instant::now();
    let id = SessionId::from_bytes([0xff; 16]);
    let commands = vec![
        Command::CreateSession { id, ttl_ms: 86_400_000, name: None },
        Command::Acquire(Acquire {
            key: Key::semaphore(names[0].clone()),
            session: id,
            permits: 1,
            wait: false,
            capacity: None,
            max_hold_ms: None,
            value: None,
        }),
    ];
    state.apply(index + 1, 1, &Batch { now_ms: index + 1, commands }, &mut effects);
    println!("first apply while a view lives: {:?}", started.elapsed());
    assert_eq!(view.encode(), bytes, "the view kept the state it was taken from");
    drop(view);
    let started = Instant::now();
    let decoded = State::decode_snapshot(&bytes).expect("decodes");
    println!("decode and verify: {:?}", started.elapsed());
    let started = Instant::now();
    decoded.verify().expect("consistent");
    println!("verify alone: {:?}", started.elapsed());
    let started = Instant::now();
    drop(decoded);
    println!("drop: {:?}", started.elapsed());
    assert_eq!(State::decode_snapshot(&bytes).expect("decodes").encode_snapshot(), bytes);
}
