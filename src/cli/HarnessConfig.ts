import type { Harness } from "../domain/Setup.ts"

/** The key travels in this header; each harness's own API-key variable only has to be non-empty. */
const PLACEHOLDER_KEY = "svc-uses-x-credit-key"

export interface HarnessInput {
  /** The router as this machine reaches it, no trailing slash. */
  readonly routerUrl: string
  readonly secret: string
  /** Where the files go (owner-only). */
  readonly configDir: string
  readonly harness: Harness
  /** One comment line saying what the key is (id, owner, cap, expiry); never the secret. */
  readonly about: string
}

export interface HarnessConfig {
  /** Files to write under `configDir`, each owner-only (0600); they hold the key. */
  readonly files: ReadonlyArray<{ readonly name: string; readonly content: string }>
  /** What to run or add, printed for the user; they never contain the key itself. */
  readonly instructions: ReadonlyArray<string>
}

export const openAiBaseUrl = (routerUrl: string) => `${routerUrl}/v1`
export const anthropicBaseUrl = (routerUrl: string) => routerUrl

const shellQuote = (value: string) => `'${value.replaceAll("'", `'"'"'`)}'`

/**
 * A shell file to `source`: the router URL and the key, then the variables this harness reads. The key is
 * written once, as `SVC_CREDIT_KEY`; everything else refers to it.
 */
const envFile = (input: HarnessInput, lines: ReadonlyArray<string>) =>
  [
    `# svc router key for ${input.harness}, written by svc-setup. ${input.about}`,
    "# Owner-only (0600). Never commit it, paste it into a browser or share it. Revoke it from the wallet's key list.",
    `export SVC_ROUTER_URL=${shellQuote(input.routerUrl)}`,
    `export SVC_CREDIT_KEY=${shellQuote(input.secret)}`,
    ...lines,
    ""
  ].join("\n")

/** The configuration each harness reads, with the lines to add for it (docs in README "Give a coding agent a key"). */
export const harnessConfig = (input: HarnessInput): HarnessConfig => {
  const envName = `${input.harness}.env`
  const envPath = `${input.configDir}/${envName}`
  const source = `source ${envPath}`
  const openai = openAiBaseUrl(input.routerUrl)
  switch (input.harness) {
    case "claude-code":
      return {
        files: [
          {
            name: envName,
            content: envFile(input, [
              'export ANTHROPIC_BASE_URL="$SVC_ROUTER_URL"',
              `export ANTHROPIC_AUTH_TOKEN=${PLACEHOLDER_KEY}`,
              'export ANTHROPIC_CUSTOM_HEADERS="x-credit-key: $SVC_CREDIT_KEY"',
              "export ANTHROPIC_MODEL=auto",
              "export ANTHROPIC_DEFAULT_HAIKU_MODEL=cheapest",
              "export ANTHROPIC_SMALL_FAST_MODEL=cheapest"
            ])
          }
        ],
        instructions: [
          "Start Claude Code with the key (or add the first line to your shell profile):",
          `  ${source}`,
          "  claude"
        ]
      }
    case "codex":
      return {
        files: [{ name: envName, content: envFile(input, []) }],
        instructions: [
          "Add to ~/.codex/config.toml:",
          '  model = "auto"',
          '  model_provider = "svc"',
          "  [model_providers.svc]",
          '  name = "svc router"',
          `  base_url = "${openai}"`,
          '  wire_api = "responses"',
          '  env_http_headers = { "x-credit-key" = "SVC_CREDIT_KEY" }',
          "Then start Codex with the key:",
          `  ${source}`,
          "  codex"
        ]
      }
    case "opencode":
      return {
        files: [{ name: envName, content: envFile(input, []) }],
        instructions: [
          'Add to ~/.config/opencode/opencode.json (merge into "provider"):',
          "  {",
          '    "provider": {',
          '      "svc": {',
          '        "npm": "@ai-sdk/openai-compatible",',
          '        "name": "svc router",',
          `        "options": { "baseURL": "${openai}", "headers": { "x-credit-key": "{env:SVC_CREDIT_KEY}" } },`,
          '        "models": { "auto": {}, "cheapest": {}, "fastest": {} }',
          "      }",
          "    },",
          '    "model": "svc/auto"',
          "  }",
          "Then start opencode with the key:",
          `  ${source}`,
          "  opencode"
        ]
      }
    case "aider": {
      const settingsName = "aider.model.settings.yml"
      return {
        files: [
          {
            name: envName,
            content: envFile(input, [
              'export OPENAI_API_BASE="$SVC_ROUTER_URL/v1"',
              `export OPENAI_API_KEY=${PLACEHOLDER_KEY}`
            ])
          },
          {
            name: settingsName,
            content: [
              `# svc router key for aider, written by svc-setup. ${input.about}`,
              "# Owner-only (0600). Never commit it.",
              ...["auto", "cheapest"].flatMap((model) => [
                `- name: openai/${model}`,
                "  extra_params:",
                "    extra_headers:",
                `      x-credit-key: ${JSON.stringify(input.secret)}`
              ]),
              ""
            ].join("\n")
          }
        ],
        instructions: [
          "Start aider with the key:",
          `  ${source}`,
          `  aider --model openai/auto --model-settings-file ${input.configDir}/${settingsName}`
        ]
      }
    }
    case "generic-openai":
      return {
        files: [
          {
            name: envName,
            content: envFile(input, [
              'export OPENAI_BASE_URL="$SVC_ROUTER_URL/v1"',
              `export OPENAI_API_KEY=${PLACEHOLDER_KEY}`,
              'export ANTHROPIC_BASE_URL="$SVC_ROUTER_URL"'
            ])
          }
        ],
        instructions: [
          "Load the key into your shell, then send it as the x-credit-key header on every request:",
          `  ${source}`,
          `  curl "$OPENAI_BASE_URL/chat/completions" -H "x-credit-key: $SVC_CREDIT_KEY" \\`,
          `    -H "content-type: application/json" -d '{"model":"auto","messages":[{"role":"user","content":"hi"}]}'`
        ]
      }
  }
}
