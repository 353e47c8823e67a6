//! MPI launchers: OpenMPI's `mpirun` (`OMPI_COMM_WORLD_RANK`/`_SIZE`) and PMIx launchers (`PMIX_RANK`), run
//! with one agent per node (`--map-by ppr:1:node`). They say nothing about where the agents meet.

use super::{invalid, number, ContextError, Env, Kind, LaunchContext};

const K: Kind = Kind::Mpi;

pub(super) fn detect(env: Env) -> Result<Option<LaunchContext>, ContextError> {
    let rank = number(K, env, &["OMPI_COMM_WORLD_RANK", "PMIX_RANK"], 0)?;
    let size = number(K, env, &["OMPI_COMM_WORLD_SIZE"], 1)?;
    if let (Some(r), Some(s)) = (&rank, &size) {
        if r.value >= s.value {
            return Err(invalid(K, &r.from, &r.value.to_string(), format!("must be less than {} ({})", s.from, s.value)));
        }
    }
    if rank.is_none() && size.is_none() {
        return Ok(None);
    }
    let mut c = LaunchContext::new(K);
    c.node_rank = rank;
    c.nnodes = size;
    Ok(Some(c))
}
