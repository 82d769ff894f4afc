//! Step outputs in scope: a chain of scopes, one per loop iteration and per
//! parallel branch, so that concurrent iterations and branches each see their
//! own outputs and those of the steps before the block.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;

#[derive(Debug, Default)]
pub struct Scope {
    parent: Option<Arc<Scope>>,
    outputs: Mutex<HashMap<u32, Arc<Value>>>,
}

impl Scope {
    pub fn root(capacity: usize) -> Scope {
        Scope {
            parent: None,
            outputs: Mutex::new(HashMap::with_capacity(capacity)),
        }
    }

    /// A scope for one loop iteration or parallel branch.
    pub fn child(parent: &Arc<Scope>) -> Arc<Scope> {
        Arc::new(Scope {
            parent: Some(Arc::clone(parent)),
            outputs: Mutex::new(HashMap::new()),
        })
    }

    fn own(&self) -> MutexGuard<'_, HashMap<u32, Arc<Value>>> {
        // A panic while the lock was held left no half-written output: every
        // write is a single insert. Keep going with the data as it is.
        self.outputs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The output of the step in `slot`, here or in an enclosing scope.
    pub fn get(&self, slot: u32) -> Option<Arc<Value>> {
        if let Some(value) = self.own().get(&slot) {
            return Some(Arc::clone(value));
        }
        self.parent.as_ref().and_then(|parent| parent.get(slot))
    }

    /// Sets the output of the step in `slot`: a value, or one shared with
    /// the step's record.
    pub fn set(&self, slot: u32, value: impl Into<Arc<Value>>) {
        self.own().insert(slot, value.into());
    }

    /// The outputs set in this scope itself, by slot order.
    pub fn own_outputs(&self) -> Vec<(u32, Arc<Value>)> {
        let mut outputs: Vec<(u32, Arc<Value>)> = self
            .own()
            .iter()
            .map(|(slot, value)| (*slot, Arc::clone(value)))
            .collect();
        outputs.sort_by_key(|(slot, _)| *slot);
        outputs
    }

    /// Copies this scope's own outputs into `target` (a branch's outputs into
    /// the scope after the join).
    pub fn merge_into(&self, target: &Scope) {
        let own = self.own_outputs();
        let mut outputs = target.own();
        for (slot, value) in own {
            outputs.insert(slot, value);
        }
    }
}
