//! muster's integration tests, one binary: each module drives the `muster` binary as a user does (real
//! processes, real torch workers, real stores) and is named after what it tests; `common` holds what they
//! share. One binary links once, where a binary per file linked each of them. Test names start with their
//! module (`cargo test --test it -- partition::` runs that file's tests); the fixtures the tests run are
//! in `tests/fixtures/` and `tests/interop/`.

mod common;

mod attacks;
mod bounds;
mod budget;
mod cli;
mod console;
mod contexts;
mod env_contract;
mod errors_catalogue;
mod escape;
mod etcd;
mod etcd_harness;
mod events;
mod gate;
mod goodput;
mod gpu;
mod hang;
mod incidents;
mod inplace;
mod inplace_shapes;
mod k8s;
mod lemons;
mod logs;
mod multinode;
mod observe;
mod partition;
mod placement;
mod plan;
mod preemption;
mod slurm;
mod status;
mod store_host;
mod store_interop;
mod straggler;
mod supervision;
mod timer;
mod train;
mod warm;
