//! Whether a rank's main thread waits on the other ranks (pure), for the straggler judge and the hang verdict.
//!
//! A collective the script calls shows in Python (a frame under `torch/distributed/`), and so does an explicit
//! `torch.cuda.synchronize()`. Most jobs wait where Python does not show it: DistributedDataParallel all-reduces
//! the gradients inside `loss.backward()`, and its reducer waits for them in C++ under the one Python frame
//! `_engine_run_backward`, the same frame as the backward's own compute; a gloo or NCCL work's wait and a
//! blocking CUDA synchronisation are C++ under a torch method too. Below Python, the thread's kernel state
//! tells them apart at no cost: a thread that computes is running (R, on a CPU or waiting for one), a thread
//! that waits on its peers sleeps (S). So a main thread asleep in torch's code waits on the others, unless
//! that code is torch's own reading and writing (data loading, `torch.load`/`save`, multiprocessing): a rank
//! starved of data or slowed by storage is slow by itself. A stopped thread (T, SIGSTOP) waits on nobody.

use super::capture::Frame;

/// What the kernel says the thread is doing (`/proc/<pid>/stat`'s state letter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadState {
    /// R: on a CPU, or ready for one.
    Running,
    /// S: in an interruptible wait (a futex, a socket, a sleep).
    Asleep,
    /// Any other: uninterruptible I/O (D), stopped (T, t), a zombie; or unknown.
    Other,
}

impl ThreadState {
    pub fn from_letter(letter: Option<&str>) -> ThreadState {
        match letter {
            Some("R") => ThreadState::Running,
            Some("S") => ThreadState::Asleep,
            _ => ThreadState::Other,
        }
    }
}

/// torch's code that reads, writes or loads data: a rank asleep there waits on its storage or its loader, not
/// on its peers.
const TORCH_IO: &[&str] = &["torch/utils/data/", "torch/serialization.py", "torch/multiprocessing/", "torch/hub.py"];

/// Whether a file is torch's own (an installed `torch` package's).
fn is_torch(file: &str) -> bool {
    file.contains("/torch/") && !TORCH_IO.iter().any(|io| file.contains(io))
}

/// Whether a main thread with `frames` (innermost first) in `state` waits on the other ranks: in a collective
/// or a CUDA synchronisation the script called, or asleep below a frame of torch's (see the module doc).
pub fn waits_on_peers(frames: &[Frame], state: ThreadState) -> bool {
    let visible = frames.iter().any(|f| {
        f.file.contains("torch/distributed/") || (f.file.contains("torch/cuda/") && f.function == "synchronize")
    });
    let below = state == ThreadState::Asleep && frames.first().is_some_and(|f| is_torch(&f.file));
    visible || below
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, file: &str) -> Frame {
        Frame { function: function.into(), file: file.into(), line: 10, code: None }
    }

    #[test]
    fn a_thread_waits_in_a_collective_or_asleep_below_torch() {
        let torch = "/venv/lib/python3.11/site-packages/torch";
        let reduce = frame("all_reduce", &format!("{torch}/distributed/distributed_c10d.py"));
        let sync = frame("synchronize", &format!("{torch}/cuda/__init__.py"));
        let backward = frame("_engine_run_backward", &format!("{torch}/autograd/graph.py"));
        let linear = frame("forward", &format!("{torch}/nn/modules/linear.py"));
        let loader = frame("_next_data", &format!("{torch}/utils/data/dataloader.py"));
        let load = frame("load", &format!("{torch}/serialization.py"));
        let own = frame("fetch_batch", "/job/train.py");
        let queue = frame("get", "/usr/lib/python3.11/queue.py");
        use ThreadState::{Asleep, Other, Running};
        // (frames innermost first, state, waits on the others)
        let table = [
            // A collective or a sync the script called: waiting, whatever the state (NCCL's waits spin).
            (vec![reduce.clone(), own.clone()], Running, true),
            (vec![reduce, own.clone()], Asleep, true),
            (vec![sync, own.clone()], Running, true),
            // DDP's reducer waits in backward: asleep there waits, running there computes.
            (vec![backward.clone(), own.clone()], Asleep, true),
            (vec![backward.clone(), own.clone()], Running, false),
            // Stopped (SIGSTOP) or in uninterruptible I/O inside torch: not waiting on anyone.
            (vec![backward, own.clone()], Other, false),
            (vec![linear, own.clone()], Running, false),
            // The job's own code or the standard library asleep (a slow fetch, a queue): its own time.
            (vec![own.clone()], Asleep, false),
            (vec![queue, own.clone()], Asleep, false),
            // torch's data loading and checkpoint I/O asleep: its own time too.
            (vec![loader, own.clone()], Asleep, false),
            (vec![load, own], Asleep, false),
            (vec![], Asleep, false),
        ];
        for (frames, state, want) in table {
            assert_eq!(waits_on_peers(&frames, state), want, "{frames:?} {state:?}");
        }
    }

    #[test]
    fn the_state_letter_is_read_as_the_kernel_writes_it() {
        let table = [
            (Some("R"), ThreadState::Running),
            (Some("S"), ThreadState::Asleep),
            (Some("D"), ThreadState::Other),
            (Some("T"), ThreadState::Other),
            (Some("t"), ThreadState::Other),
            (None, ThreadState::Other),
        ];
        for (letter, want) in table {
            assert_eq!(ThreadState::from_letter(letter), want, "{letter:?}");
        }
    }
}
