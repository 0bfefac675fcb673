import { homedir } from "node:os"
import { NodeRuntime, NodeServices } from "@effect/platform-node"
import { Console, Effect, Option } from "effect"
import { Command, Flag } from "effect/cli"
import { HARNESSES, harnessNames } from "../domain/Setup.ts"
import { formatUsdc } from "../payment/Keys.ts"
import { maskKey, parseDuration } from "./Format.ts"
import { anthropicBaseUrl, harnessConfig, openAiBaseUrl } from "./HarnessConfig.ts"
import { defaultConfigDir, writeOwnerOnly } from "./OwnerOnlyFiles.ts"
import { SetupFailed, waitForKey } from "./Polling.ts"
import { withProgress } from "./Progress.ts"
import { renderQr } from "./Qr.ts"
import { SetupClient } from "./SetupClient.ts"

const flags = {
  router: Flag.String("router").pipe(
    Flag.withDescription("The router's base URL (default: $SVC_ROUTER_URL, else http://127.0.0.1:8402)"),
    Flag.optional
  ),
  harness: Flag.Literals("harness", HARNESSES).pipe(
    Flag.withDescription(
      "The coding agent to configure: claude-code (Anthropic-compatible, ANTHROPIC_* variables), codex " +
        "(~/.codex/config.toml provider), opencode (opencode.json provider), aider (OPENAI_API_BASE and a " +
        "model settings file) or generic-openai (OPENAI_BASE_URL and the x-credit-key header)"
    )
  ),
  budget: Flag.String("budget").pipe(
    Flag.withDescription(
      "The key's spending cap in USDC, e.g. 5 or 2.50; the wallet may approve less, never more"
    )
  ),
  expires: Flag.String("expires").pipe(
    Flag.withDescription(
      "When the key expires, from now: 90m, 12h, 30d, 2w (1 hour to 90 days; default 30d)"
    ),
    Flag.optional
  ),
  configDir: Flag.String("config-dir").pipe(
    Flag.withDescription(
      "Where to write the key, owner-only (file 0600, directory 0700), never inside a git repository " +
        "(default: $XDG_CONFIG_HOME/svc-setup, else ~/.config/svc-setup)"
    ),
    Flag.optional
  ),
  wallet: Flag.String("wallet").pipe(
    Flag.withDescription("Only this wallet (0x address) may approve; by default any invited wallet can"),
    Flag.optional
  ),
  label: Flag.String("label").pipe(
    Flag.withDescription("The key's name in the wallet's key list (default: '<harness> (agent setup)')"),
    Flag.optional
  ),
  noQr: Flag.Boolean("no-qr").pipe(
    Flag.withDescription("Do not print the QR code of the approval URL"),
    Flag.withDefault(false)
  )
}

const routerUrlOf = (flag: Option.Option<string>) =>
  Option.getOrElse(flag, () => process.env.SVC_ROUTER_URL ?? "http://127.0.0.1:8402")
    .trim()
    .replace(/\/+$/, "")

const isoTime = (unixSeconds: number) => new Date(unixSeconds * 1000).toISOString().replace(".000Z", "Z")

const setup = Command.make("svc-setup", flags, (input) =>
  Effect.gen(function* () {
    const routerUrl = routerUrlOf(input.router)
    const keyExpiresIn = yield* Option.match(input.expires, {
      onNone: () => Effect.succeed(undefined),
      onSome: (text) => {
        const seconds = parseDuration(text)
        return seconds === undefined
          ? Effect.fail(
              new SetupFailed({ message: `--expires ${text}: expected a duration such as 90m, 12h or 30d` })
            )
          : Effect.succeed(seconds)
      }
    })
    const configDir = Option.getOrElse(input.configDir, () => defaultConfigDir(process.env, homedir()))

    const client = yield* SetupClient
    const started = yield* client.start({
      harness: input.harness,
      budget_usdc: input.budget,
      ...(keyExpiresIn === undefined ? {} : { key_expires_in: keyExpiresIn }),
      ...Option.match(input.wallet, { onNone: () => ({}), onSome: (wallet) => ({ wallet }) }),
      ...Option.match(input.label, { onNone: () => ({}), onSome: (label) => ({ label }) })
    })
    const terms = started.setup
    yield* Console.log(
      [
        `A key for ${harnessNames[input.harness]} that spends up to ${terms.budget_usdc} USDC, expiring ${isoTime(terms.key_expires_at)}.`,
        "Approve it with your wallet at:",
        `  ${started.verification_uri_complete}`,
        `or open ${started.verification_uri} and enter the code:`,
        `  ${started.user_code}`,
        ""
      ].join("\n")
    )
    if (!input.noQr)
      yield* Console.log(
        `${renderQr(started.verification_uri_complete, { ansi: process.stdout.isTTY === true })}\n`
      )

    const token = yield* withProgress(
      {
        userCode: started.user_code,
        intervalSeconds: started.interval,
        expiresInSeconds: started.expires_in
      },
      (onPoll) =>
        waitForKey({
          intervalSeconds: started.interval,
          expiresInSeconds: started.expires_in,
          exchange: client.exchange(started.device_code),
          onPoll
        })
    )
    const config = harnessConfig({
      routerUrl,
      secret: token.access_token,
      configDir,
      harness: input.harness,
      about: `Key ${token.key_id} of ${token.wallet}, cap ${formatUsdc(token.budget)} USDC, expires ${isoTime(token.key_expires_at)}.`
    })
    const written = yield* writeOwnerOnly(configDir, config.files)
    yield* Console.log(
      [
        `Approved by ${token.wallet}: key ${token.key_id} (${maskKey(token.access_token)}), cap ${token.budget_usdc} USDC, expires ${isoTime(token.key_expires_at)}.`,
        ...written.map((path) => `Wrote ${path} (owner-only, 0600).`),
        "",
        `OpenAI-compatible base URL:    ${openAiBaseUrl(routerUrl)}`,
        `Anthropic-compatible base URL: ${anthropicBaseUrl(routerUrl)}`,
        "The key is sent in the x-credit-key header; the file above holds it as SVC_CREDIT_KEY.",
        "",
        ...config.instructions,
        ""
      ].join("\n")
    )
  }).pipe(
    Effect.provide(SetupClient.layer(routerUrlOf(input.router))),
    Effect.catchTag("SetupFailed", (failure) =>
      Effect.andThen(
        Console.error(`svc-setup: ${failure.message}`),
        Effect.sync(() => {
          process.exitCode = 1
        })
      )
    )
  )
).pipe(
  Command.withDescription(
    "Gives a coding agent its own bounded spend key through the router's device flow (RFC 8628): starts a " +
      "setup, shows a code, a URL and a QR code for the wallet holder to approve in the browser, waits for the " +
      "approval, then writes the harness configuration (base URL and key) to an owner-only file outside any " +
      "repository and prints the lines to add. The key is never printed in full. Exit status 0 when a key was " +
      "written, 1 when the setup was denied, expired or failed."
  ),
  Command.withExamples([
    { command: "svc-setup --harness claude-code --budget 5", description: "A 5 USDC key for Claude Code" },
    {
      command: "svc-setup --router https://router.example --harness codex --budget 2.50 --expires 7d",
      description: "A 2.50 USDC key for Codex, expiring in a week"
    }
  ])
)

setup.pipe(Command.run({ version: "0.1.0" }), Effect.provide(NodeServices.layer), NodeRuntime.runMain)
