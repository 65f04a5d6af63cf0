//! The segment log on the simulated disk: a power cut keeps what was synced, tears what was
//! not (`permit_sim::disk`), and the log's open repairs the torn tail.

use openraft::storage::RaftLogStorage;
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
use permit_server::raft::log::SegmentLog;
use permit_server::raft::TypeConfig;
use permit_sim::disk::SimDisk;

fn blank(index: u64) -> Entry<TypeConfig> {
    Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), index), payload: EntryPayload::Blank }
}

fn log_id(index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(1, 1), index)
}

/// Entries 1-3 are synced; then two commit index records (written without an fsync of their
/// own) and entries 4-6, whose fsync fails with them left in the file. The power cut keeps
/// `keep` of those three writes whole and tears the next one, in each of the disk's three ways
/// (lost with the writes after it kept, half kept with the writes after it kept, half kept and
/// nothing after it): the reopened log holds 1-3 and the last commit index before the tear,
/// plus those of 4-6 whose records precede the tear (never acknowledged, but on the disk: the
/// first half of their write holds entry 4 whole).
#[tokio::test]
async fn a_power_cut_tears_what_was_not_synced_and_the_open_repairs_it() {
    let dir = std::path::Path::new("/sim/node-1/raft-log");
    for (keep, last, committed) in [(0, 3, None), (1, 3, Some(2)), (2, 4, Some(3)), (3, 6, Some(3))] {
        let disk = SimDisk::new();
        let mut log = SegmentLog::open_on(disk.mount(), dir).unwrap();
        log.append_entries((1..=3).map(blank).collect()).unwrap();
        log.save_committed(Some(log_id(2))).await.unwrap();
        log.save_committed(Some(log_id(3))).await.unwrap();
        disk.fail_next_sync(true);
        log.append_entries((4..=6).map(blank).collect()).expect_err("the fsync fails");
        let cut = disk.power_cut(keep);
        assert_eq!(cut.torn_writes > 0, keep < 3, "keep {keep}: {cut:?}");
        drop(log);

        let mut log = SegmentLog::open_on(disk.mount(), dir).expect("a torn tail is repaired, not refused");
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id, Some(log_id(last)), "keep {keep}");
        assert_eq!(log.read_committed().await.unwrap(), committed.map(log_id), "keep {keep}");
        // The repaired log takes appends after its end, and they survive the next power cut.
        log.append_entries(vec![blank(last + 1)]).unwrap();
        disk.power_cut(0);
        drop(log);
        let mut log = SegmentLog::open_on(disk.mount(), dir).unwrap();
        assert_eq!(log.get_log_state().await.unwrap().last_log_id, Some(log_id(last + 1)), "keep {keep}");
    }
}
