//! dofs scenarios across stores, linked once: the sync rules end to end
//! (`sync`) and the hub-topology property test (`convergence`).

mod convergence;
mod gc_race;
mod sync;
mod util;
