//! Many independent runs of a slow external program (Envoy validating a file), a few at
//! a time: most of each run is the program starting, so the machine's cores overlap them.

/// Calls `check` on every item, `2 × cores` (at least 4) at a time, and returns what the
/// calls returned (`Some`, e.g. a problem found), in the items' order.
pub fn in_batches<T: Sync, R: Send>(items: &[T], check: impl Fn(&T) -> Option<R> + Sync) -> Vec<R> {
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .max(2)
        * 2;
    let chunk = items.len().div_ceil(workers).max(1);
    let check = &check;
    std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .chunks(chunk)
            .map(|part| scope.spawn(move || part.iter().filter_map(check).collect::<Vec<R>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_is_checked_once_and_the_order_is_kept() {
        let items: Vec<u32> = (0..101).collect();
        let odd = in_batches(&items, |n| (n % 2 == 1).then_some(*n));
        assert_eq!(odd, (0..101).filter(|n| n % 2 == 1).collect::<Vec<_>>());
        assert!(in_batches(&[] as &[u32], |n| Some(*n)).is_empty());
    }
}
