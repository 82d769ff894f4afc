//! Signature help: inside a step call's record, what the callee takes, with
//! the input being written (or the next one not given yet) marked.

use crate::Checked;
use crate::ide::completion::{callee_params, given_fields, step_callee};
use crate::syntax::cursor;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    /// `recipe classify { subject: string, body: string } → { ... }`.
    pub label: String,
    /// Each input's byte range in `label`, in order.
    pub parameters: Vec<(u32, u32)>,
    /// The input at the cursor: the one being written, else the first not
    /// given yet; `None` when every input is given.
    pub active: Option<usize>,
}

/// The signature of the call whose argument record holds `offset` in the
/// root file, which need not parse.
pub fn signature_help(checked: &Checked, offset: u32) -> Option<Signature> {
    let text = &checked.files.first()?.text;
    let offset = (offset as usize).min(text.len());
    if !text.is_char_boundary(offset) {
        return None;
    }
    let (brace, b'{') = *cursor::scan(text, offset).open.last()? else {
        return None;
    };
    let callee = step_callee(text, brace)?;
    let env = &checked.analysis.env;
    let params = callee_params(env, callee)?;
    let mut label = match env.recipes.get(callee) {
        Some(_) => format!("recipe {callee} {{ "),
        None => format!("{callee} {{ "),
    };
    let mut parameters = Vec::new();
    for (index, (name, ty)) in params.iter().enumerate() {
        if index > 0 {
            label.push_str(", ");
        }
        let start = label.len() as u32;
        label.push_str(&format!("{name}: {}", env.show(ty)));
        parameters.push((start, label.len() as u32));
    }
    label.push_str(" }");
    if let Some(info) = env.recipes.get(callee) {
        label.push_str(&format!(" → {}", env.show(&info.output)));
    }
    let body = &text[brace + 1..offset];
    let given = given_fields(body);
    // After `name:` and before the separator that ends its value, `name`
    // is being written.
    let writing = given.last().filter(|_| {
        let tail = body.trim_end_matches([' ', '\t']);
        !tail.ends_with([',', '\n']) && !tail.ends_with('{')
    });
    let active = match writing {
        Some(name) => params.iter().position(|(param, _)| param == name),
        None => params
            .iter()
            .position(|(param, _)| !given.contains(&param.as_str())),
    };
    Some(Signature {
        label,
        parameters,
        active,
    })
}
