-- Drives a headless Neovim through the editor scenarios of
-- lsp/tests/neovim.rs, loaded as `nvim --headless --clean -u driver.lua`.
--
-- The Rust test prepares a copy of examples/ and passes, in the environment:
-- FLOW_LSP (the server binary), FLOW_SNIPPET (editors/nvim/flow.lua, so that
-- the snippet users copy is the one under test), FLOW_WORK (the copy) and
-- FLOW_RESULT (where this script writes what it saw, as JSON). The assertions
-- are in Rust; this script only collects, and exits non-zero with a message
-- in FLOW_RESULT when a step cannot even be carried out.

local work = assert(os.getenv("FLOW_WORK"), "FLOW_WORK is set")
local result_path = assert(os.getenv("FLOW_RESULT"), "FLOW_RESULT is set")
local results = {}

-- Every wait is bounded, so that a server that never answers fails the test
-- with a message rather than hanging it.
local TIMEOUT_MS = 15000

local function wait_for(what, condition)
  if not vim.wait(TIMEOUT_MS, condition, 10) then
    error("timed out waiting for " .. what, 0)
  end
end

local function write_results(value)
  local file = assert(io.open(result_path, "w"))
  file:write(vim.json.encode(value))
  file:close()
end

-- Opens a file of the copy and waits until flow-lsp has attached to it.
local function open(name)
  vim.cmd.edit(vim.fn.fnameescape(work .. "/" .. name))
  local buf = vim.api.nvim_get_current_buf()
  if vim.bo[buf].filetype ~= "flow" then
    error(name .. " has filetype '" .. vim.bo[buf].filetype .. "', not flow", 0)
  end
  local client
  wait_for("flow-lsp to attach to " .. name, function()
    client = vim.lsp.get_clients({ bufnr = buf, name = "flow-lsp" })[1]
    return client ~= nil and client.initialized
  end)
  return buf, client
end

-- Puts the cursor on the first `needle` of the buffer, `shift` bytes into it.
local function cursor_at(buf, needle, shift)
  for line, text in ipairs(vim.api.nvim_buf_get_lines(buf, 0, -1, false)) do
    local column = text:find(needle, 1, true)
    if column then
      vim.api.nvim_win_set_cursor(0, { line, column - 1 + (shift or 0) })
      return line - 1, column - 1
    end
  end
  error("`" .. needle .. "` is not in the buffer", 0)
end

local function run()
  -- Errors the LSP client reports (a failed rename, a server that died) go to
  -- vim.notify, which prints nowhere useful in a headless editor: keep them
  -- for the report.
  results.messages = {}
  vim.notify = function(message, level)
    table.insert(results.messages, { message = tostring(message), level = level })
  end

  dofile(assert(os.getenv("FLOW_SNIPPET"), "FLOW_SNIPPET is set")).setup({
    -- In parentheses: `assert` returns its message too, which would be
    -- passed to the server as an argument.
    cmd = { (assert(os.getenv("FLOW_LSP"), "FLOW_LSP is set")) },
    init_options = { debounceMs = 20 },
  })

  -- 1. The example with a misspelt step reference is underlined on opening.
  local triage = open("support_triage.flow")
  wait_for("diagnostics on support_triage.flow", function()
    return #vim.diagnostic.get(triage) > 0
  end)
  results.diagnostics = vim.tbl_map(function(d)
    return { code = d.code, message = d.message, line = d.lnum, column = d.col, source = d.source }
  end, vim.diagnostic.get(triage))

  -- The messages are shown inline: the text of the virtual-text extmarks.
  results.inline = {}
  for _, mark in ipairs(vim.api.nvim_buf_get_extmarks(triage, -1, 0, -1, { details = true })) do
    for _, chunk in ipairs(mark[4].virt_text or {}) do
      table.insert(results.inline, chunk[1])
    end
  end

  -- Highlighting from the server alone (the buffer has no syntax file):
  -- the semantic-token groups at the first occurrence of each needle.
  wait_for("semantic tokens on support_triage.flow", function()
    return #vim.inspect_pos(triage, 0, 0).semantic_tokens > 0
  end)
  results.syntax = vim.b[triage].current_syntax or ""
  results.highlights = {}
  for _, needle in ipairs({ "// Support", "import", '"recipes/support.flow"', "30m", "classify_ticket",
    "classify =", ">=", "{{workflow_input.body}}", "workflow_input.body", "ticket_id: string" }) do
    local line, column = cursor_at(triage, needle)
    -- Neovim applies the tokens of the lines a window shows, as it draws.
    vim.cmd.redraw()
    local groups = {}
    for _, token in ipairs(vim.inspect_pos(triage, line, column).semantic_tokens) do
      table.insert(groups, token.opts.hl_group)
    end
    results.highlights[needle] = groups
  end

  -- The quick fix of the misspelt step, applied with the editor's own
  -- code action (the preferred one, applied without asking).
  cursor_at(triage, "{{step.clasify.summary}}", #"{{step.")
  vim.lsp.buf.code_action({
    apply = true,
    filter = function(action)
      return action.isPreferred
    end,
  })
  wait_for("the quick fix to reach the buffer", function()
    local lines = vim.api.nvim_buf_get_lines(triage, 0, -1, false)
    return table.concat(lines, "\n"):find("{{step.classify.summary}}", 1, true) ~= nil
  end)
  wait_for("the fixed file to have no diagnostics", function()
    return #vim.diagnostic.get(triage) == 0
  end)

  -- 2. Completion after a half-typed `{{step.` in an unterminated string:
  -- the server must answer from what it recovers of the broken document.
  local leads, client = open("lead_enrichment.flow")
  local line = cursor_at(leads, "content: step.ranked.brief")
  local text = vim.api.nvim_buf_get_lines(leads, line, line + 1, false)[1]
  local typed = text:gsub("content: step%.ranked%.brief", 'content: "{{step.')
  vim.api.nvim_buf_set_lines(leads, line, line + 1, false, { typed })
  -- The position after the last character, where the cursor is in insert
  -- mode as one types (a normal-mode cursor cannot be put there).
  local params = {
    textDocument = vim.lsp.util.make_text_document_params(leads),
    position = { line = line, character = vim.str_utfindex(typed, client.offset_encoding) },
  }
  local answer, err = client:request_sync("textDocument/completion", params, TIMEOUT_MS, leads)
  if not answer or answer.err then
    error("completion failed: " .. vim.inspect(err or answer.err), 0)
  end
  local items = answer.result and (answer.result.items or answer.result) or {}
  results.completion = vim.tbl_map(function(item)
    return { label = item.label, detail = item.detail }
  end, items)
  -- The edit was only for completion: drop it, so that `:wa` below does not
  -- write it (wiping the buffer also closes the document on the server).
  vim.cmd("bwipeout! " .. leads)

  -- 3. Rename a step with the editor's own rename, then write every buffer.
  local pipeline = open("content_pipeline.flow")
  cursor_at(pipeline, "step edit =", #"step ")
  vim.lsp.buf.rename("copyedit_step")
  wait_for("the rename to reach the buffer", function()
    local lines = vim.api.nvim_buf_get_lines(pipeline, 0, -1, false)
    return table.concat(lines, "\n"):find("step copyedit_step =", 1, true) ~= nil
  end)
  vim.cmd("wa")
  results.modified_after_write = vim.tbl_filter(function(buf)
    return vim.bo[buf].modified
  end, vim.api.nvim_list_bufs())
end

-- Neovim turns filetype detection on after the init file, as it does for a
-- user's init.lua: the scenarios run once start-up is over. `nested`, or the
-- :edit inside would trigger no autocommands: no filetype, no server.
vim.api.nvim_create_autocmd("VimEnter", {
  once = true,
  nested = true,
  callback = function()
    local ok, failure = xpcall(run, debug.traceback)
    results.ok = ok
    if not ok then
      results.error = tostring(failure)
    end
    write_results(results)
    vim.cmd(ok and "qall!" or "cquit 1")
  end,
})
