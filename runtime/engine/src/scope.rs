//! Step outputs in scope: a chain of scopes, one per loop iteration and per
//! parallel branch, so that concurrent iterations and branches each see their
//! own outputs and those of the steps before the block.
//!
//! A loop's or a parallel's output is kept as the outputs its iterations or
//! branches set, shared with them, not copied into one value when the block
//! ends: a 10,000-item loop copied every output it made once more (13 % of
//! B2's profile), mostly for a reference that reads one of them. A reference
//! walks into the shared outputs; only one that names a whole iteration, a
//! whole branch or the whole list builds it as a value (`Output::to_value`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use flow_plan::Slot;
use serde_json::{Map, Value};

/// A step's output in scope.
#[derive(Debug, Clone)]
pub enum Output {
    /// A step's value, shared with its record.
    Value(Arc<Value>),
    /// A loop's: what each iteration set, in order.
    Iterations(Arc<Vec<Outputs>>),
    /// A parallel's: what each branch set, by the branch's name.
    Branches(Arc<Vec<(String, Outputs)>>),
}

/// What one iteration or branch set: outputs by slot, in slot order.
pub type Outputs = Vec<(u32, Output)>;

impl From<Value> for Output {
    fn from(value: Value) -> Output {
        Output::Value(Arc::new(value))
    }
}

impl From<Arc<Value>> for Output {
    fn from(value: Arc<Value>) -> Output {
        Output::Value(value)
    }
}

impl Output {
    /// The output as one value: a loop's, a list with an object per
    /// iteration; a parallel's, an object with one per branch; each of those
    /// objects holds its steps' outputs by step id (`slots` names them).
    pub fn to_value(&self, slots: &[Slot]) -> Value {
        match self {
            Output::Value(value) => Value::clone(value),
            Output::Iterations(iterations) => Value::Array(
                iterations
                    .iter()
                    .map(|outputs| outputs_to_value(outputs, slots))
                    .collect(),
            ),
            Output::Branches(branches) => Value::Object(
                branches
                    .iter()
                    .map(|(name, outputs)| (name.clone(), outputs_to_value(outputs, slots)))
                    .collect(),
            ),
        }
    }
}

/// One iteration's or branch's outputs as an object, by step id.
pub fn outputs_to_value(outputs: &Outputs, slots: &[Slot]) -> Value {
    let mut record = Map::new();
    for (slot, output) in outputs {
        if let Some(info) = slots.get(*slot as usize) {
            record.insert(info.id.clone(), output.to_value(slots));
        }
    }
    Value::Object(record)
}

/// The output of the step named `id` among `outputs`.
pub fn output_named<'o>(outputs: &'o Outputs, id: &str, slots: &[Slot]) -> Option<&'o Output> {
    outputs
        .iter()
        .find(|(slot, _)| slots.get(*slot as usize).is_some_and(|info| info.id == id))
        .map(|(_, output)| output)
}

#[derive(Debug, Default)]
pub struct Scope {
    parent: Option<Arc<Scope>>,
    outputs: Mutex<HashMap<u32, Output>>,
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

    fn own(&self) -> MutexGuard<'_, HashMap<u32, Output>> {
        // A panic while the lock was held left no half-written output: every
        // write is a single insert. Keep going with the data as it is.
        self.outputs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The output of the step in `slot`, here or in an enclosing scope.
    pub fn get(&self, slot: u32) -> Option<Output> {
        if let Some(output) = self.own().get(&slot) {
            return Some(output.clone());
        }
        self.parent.as_ref().and_then(|parent| parent.get(slot))
    }

    /// Sets the output of the step in `slot`: a value, one shared with the
    /// step's record, or a block's outputs.
    pub fn set(&self, slot: u32, output: impl Into<Output>) {
        self.own().insert(slot, output.into());
    }

    /// The outputs set in this scope itself, by slot order.
    pub fn own_outputs(&self) -> Outputs {
        let mut outputs: Outputs = self
            .own()
            .iter()
            .map(|(slot, output)| (*slot, output.clone()))
            .collect();
        outputs.sort_unstable_by_key(|(slot, _)| *slot);
        outputs
    }

    /// Copies this scope's own outputs into `target` (a branch's outputs into
    /// the scope after the join).
    pub fn merge_into(&self, target: &Scope) {
        let own = self.own_outputs();
        let mut outputs = target.own();
        for (slot, output) in own {
            outputs.insert(slot, output);
        }
    }
}
