-- Neovim (0.11 or newer) support for .flow files: filetype detection, comment
-- settings and the flow-lsp language server, started once per workspace.
--
-- Copy this file to ~/.config/nvim/lua/flow.lua and call, from init.lua:
--
--   require("flow").setup()
--
-- or load it in place with dofile("/path/to/editors/nvim/flow.lua").setup().
-- Options (all optional):
--   cmd          the server command, { "flow-lsp" } by default (it must be on
--                PATH: `cargo install --path lsp` puts it there)
--   init_options sent with `initialize`, such as { debounceMs = 40 }, the pause
--                after the last edit before diagnostics are computed
--   root_markers files that mark the workspace root, searched upwards from the
--                buffer; the buffer's own directory when none is found
--   virtual_text show each diagnostic's message at the end of its line (true
--                by default; Neovim 0.11 shows only the underline unless
--                told); false to leave it to vim.diagnostic's own settings,
--                or a table of vim.diagnostic.Opts.VirtualText
--
-- Highlighting needs no syntax file: flow-lsp sends semantic tokens for every
-- token (keywords, strings, comments, numbers, durations, operators, step ids,
-- fields, types), which Neovim colours through its @lsp.type.* groups.

local M = {}

function M.setup(opts)
  opts = opts or {}
  local cmd = opts.cmd or { "flow-lsp" }
  local root_markers = opts.root_markers or { "flow.lock", ".git" }
  local virtual_text = opts.virtual_text
  if virtual_text == nil then
    virtual_text = true
  end

  -- Neovim has no built-in "flow" filetype; without this the buffer would
  -- have none, and no FileType event would start the server.
  vim.filetype.add({ extension = { flow = "flow" } })

  local group = vim.api.nvim_create_augroup("flow_lsp", { clear = true })
  vim.api.nvim_create_autocmd("FileType", {
    group = group,
    pattern = "flow",
    callback = function(args)
      -- Line comments are `//`, which `gc` and `:h 'comments'` must know.
      vim.bo[args.buf].commentstring = "// %s"
      vim.bo[args.buf].comments = "s1:/*,mb:*,ex:*/,:///,://"
      local name = vim.api.nvim_buf_get_name(args.buf)
      -- vim.lsp.start reuses a running client with the same name and root,
      -- so every buffer of a workspace shares one server, which is what lets
      -- references and rename reach all of its files.
      vim.lsp.start({
        name = "flow-lsp",
        cmd = cmd,
        root_dir = vim.fs.root(args.buf, root_markers) or vim.fs.dirname(name),
        init_options = opts.init_options,
        on_init = function(client)
          -- Messages inline for this server's diagnostics only: the
          -- setting is per namespace, so other languages keep theirs.
          if virtual_text then
            vim.diagnostic.config(
              { virtual_text = virtual_text },
              vim.lsp.diagnostic.get_namespace(client.id)
            )
          end
        end,
      }, { bufnr = args.buf })
    end,
  })
end

return M
