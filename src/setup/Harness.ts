import { Schema } from "effect"

/** The coding-agent harnesses a setup can configure (`generic-openai`: any OpenAI-compatible client). */
export const HARNESSES = ["claude-code", "codex", "opencode", "aider", "generic-openai"] as const
export const Harness = Schema.Literals(HARNESSES)
export type Harness = typeof Harness.Type

/** How the approval page names each harness to the wallet holder. */
export const harnessNames: Record<Harness, string> = {
  "claude-code": "Claude Code",
  codex: "Codex CLI",
  opencode: "opencode",
  aider: "aider",
  "generic-openai": "an OpenAI-compatible client"
}
