import { Console, Effect, Layer, Redacted } from "effect"
import { Chain } from "./chain/Chain.ts"
import { RouterConfig } from "./RouterConfig.ts"

/** Printed once the server listens. Keys appear only for the public dev mnemonic. */
export const BannerLive = Layer.effectDiscard(
  Effect.gen(function* () {
    const config = yield* RouterConfig
    const chain = yield* Chain
    const lines = [
      "svc router is serving",
      `  base url        ${config.publicUrl}`,
      `  market page     ${config.publicUrl}/market`,
      `  network         ${chain.network} (${chain.mode === "embedded" ? "embedded anvil" : chain.rpcUrl})`,
      `  token (USDC)    ${chain.token}`,
      `  epoch anchor    ${chain.anchor}`,
      `  treasury        ${chain.treasury}`,
      `  router signer   ${chain.routerSigner}`
    ]
    if (config.operatorTokenGenerated) {
      lines.push(
        `  operator token  ${Redacted.value(config.operatorToken)}  (generated for this run; set OPERATOR_TOKEN)`
      )
    }
    if (chain.demoWallets.length > 0) {
      lines.push("  demo wallets (public dev mnemonic, 10,000 test USDC each):")
      for (const wallet of chain.demoWallets) {
        lines.push(`    ${wallet.address}${wallet.privateKey ? `  key ${wallet.privateKey}` : ""}`)
      }
    }
    yield* Console.log(lines.join("\n"))
  })
)
