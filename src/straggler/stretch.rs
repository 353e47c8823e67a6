//! When a lagging rank is named, and when its stretch ends (pure). A rank is named once it lags in
//! [`NAMED_AFTER`] windows in a row (one window is not enough: on a busy host a rank may lose the CPU for a
//! while by chance), and it keeps pace again only after as many windows in a row without lagging: a rank slow
//! through a whole run, judged on a busy host, is one stretch, not a new one at each window it squeaks through.

use std::collections::BTreeMap;

/// Consecutive windows a rank must lag in before it is named, and keep pace in before its stretch ends.
pub const NAMED_AFTER: u32 = 2;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Stretch {
    /// Windows in a row it lagged in (0 after a window it kept pace in).
    lagging: u32,
    /// Named, and windows in a row it kept pace in since.
    named: bool,
    keeping: u32,
}

/// What one window changed, by rank.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Named in this window: a new stretch.
    pub named: Vec<u32>,
    /// Named and lagging in this window (the new ones included): what `--on-straggler drain` drains.
    pub lagging: Vec<u32>,
    /// Their stretch ended: they kept pace again.
    pub again: Vec<u32>,
}

/// Every rank's stretch, across the windows judged.
#[derive(Debug, Default)]
pub struct Stretches {
    ranks: BTreeMap<u32, Stretch>,
}

impl Stretches {
    /// The next window judged: `judged` the ranks it could judge (sampled enough, or with a GPU clock),
    /// `lagging` those the judge named. A rank not judged (its node's window missing, too few samples) keeps
    /// its stretch as it was: no evidence either way.
    pub fn window(&mut self, judged: &[u32], lagging: &[u32]) -> Changes {
        let mut changes = Changes::default();
        for &rank in lagging {
            let s = self.ranks.entry(rank).or_default();
            s.lagging += 1;
            s.keeping = 0;
            if !s.named && s.lagging >= NAMED_AFTER {
                s.named = true;
                changes.named.push(rank);
            }
            if s.named {
                changes.lagging.push(rank);
            }
        }
        self.ranks.retain(|rank, s| {
            if lagging.contains(rank) || !judged.contains(rank) {
                return true;
            }
            s.lagging = 0;
            s.keeping += 1;
            if s.named && s.keeping >= NAMED_AFTER {
                changes.again.push(*rank);
                return false;
            }
            s.named
        });
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stretch_starts_after_two_lagging_windows_and_ends_after_two_kept() {
        // (ranks lagging in each window, in order; what each window changed: named, lagging named, again)
        type Row = (&'static [u32], &'static [u32], &'static [u32], &'static [u32]);
        let windows: &[Row] = &[
            (&[2], &[], &[], &[]),
            // A second window in a row: named.
            (&[2, 3], &[2], &[2], &[]),
            // One window kept: still the same stretch (not "again", not named anew).
            (&[3], &[3], &[3], &[]),
            (&[2, 3], &[], &[2, 3], &[]),
            (&[], &[], &[], &[]),
            // Two windows kept in a row: the stretch ends.
            (&[], &[], &[], &[2, 3]),
            // A new stretch needs two lagging windows again.
            (&[2], &[], &[], &[]),
            (&[], &[], &[], &[]),
            (&[2], &[], &[], &[]),
            (&[2], &[2], &[2], &[]),
        ];
        let mut stretches = Stretches::default();
        for (i, (lagging, named, drained, again)) in windows.iter().enumerate() {
            let got = stretches.window(&[0, 1, 2, 3], lagging);
            let want = Changes { named: named.to_vec(), lagging: drained.to_vec(), again: again.to_vec() };
            assert_eq!(got, want, "window {i}");
        }
    }

    #[test]
    fn a_rank_missing_from_a_window_keeps_its_stretch() {
        let mut stretches = Stretches::default();
        assert_eq!(stretches.window(&[0, 2], &[2]), Changes::default());
        // Rank 2's node's window is missing: its lagging window still counts towards the next.
        assert_eq!(stretches.window(&[0], &[]), Changes::default());
        let named = stretches.window(&[0, 2], &[2]);
        assert_eq!((named.named, named.lagging), (vec![2], vec![2]));
        // Named, then missing twice: still named (not "again").
        assert!(stretches.window(&[0], &[]).again.is_empty());
        assert!(stretches.window(&[0], &[]).again.is_empty());
        assert_eq!(stretches.window(&[0, 2], &[]).again, Vec::<u32>::new());
        assert_eq!(stretches.window(&[0, 2], &[]).again, vec![2]);
    }
}
