// The VS Code client of flow-lsp: highlighting comes from the TextMate
// grammar in syntaxes/; everything else (diagnostics, completion, hover,
// definition, references, rename, outline, semantic tokens, formatting, quick
// fixes) from the server, started over stdio for the .flow files of the
// workspace.
"use strict";

const vscode = require("vscode");
const { LanguageClient, TransportKind } = require("vscode-languageclient/node");

let client;

async function activate() {
  const config = vscode.workspace.getConfiguration("flow");
  const command = config.get("server.path", "flow-lsp");
  const serverOptions = {
    run: { command, transport: TransportKind.stdio },
    debug: { command, transport: TransportKind.stdio },
  };
  const clientOptions = {
    // Saved files only: the server reads imports from disk and from the
    // buffers it has open, and an untitled buffer has no path to import from.
    documentSelector: [{ scheme: "file", language: "flow" }],
    initializationOptions: { debounceMs: config.get("server.debounceMs", 40) },
  };
  client = new LanguageClient("flow", "flow-lsp", serverOptions, clientOptions);
  await client.start();
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
