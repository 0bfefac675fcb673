import { Context, Effect, Layer, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { getAddress, isAddress } from "viem"
import { NotFound } from "../domain/Errors.ts"

export const Dialect = Schema.Literals(["openai", "anthropic"])
export type Dialect = typeof Dialect.Type

const Address = Schema.String.check(
  Schema.makeFilter((s) => (isAddress(s, { strict: false }) ? undefined : "expected a 20-byte hex address"))
)
const BaseUrl = Schema.String.check(
  Schema.makeFilter((s) =>
    /^https?:\/\/[^\s/?#]+(\/[^\s]*)?$/.test(s) ? undefined : "expected an http(s) URL"
  )
)

export const ProviderRegistration = Schema.Struct({
  provider_id: Schema.String.check(Schema.isPattern(/^[A-Za-z0-9._:-]{1,128}$/)),
  signer: Address,
  base_url: BaseUrl,
  dialect: Dialect
})
export type ProviderRegistration = typeof ProviderRegistration.Type

export const Provider = Schema.Struct({
  ...ProviderRegistration.fields,
  enabled: Schema.Boolean
})
export type Provider = typeof Provider.Type

const decodeRows = Schema.decodeUnknownEffect(Schema.Array(Provider))

/**
 * The provider registry (admin). The book of record is the `providers` table; each
 * instance keeps a map for the hot path and re-reads it on every change it makes and
 * on the book's sync tick, so a disable on one instance reaches all of them.
 */
export class Providers extends Context.Service<
  Providers,
  {
    readonly register: (registration: ProviderRegistration) => Effect.Effect<Provider>
    readonly list: Effect.Effect<ReadonlyArray<Provider>>
    readonly setEnabled: (providerId: string, enabled: boolean) => Effect.Effect<Provider, NotFound>
    readonly get: (providerId: string) => Provider | undefined
    readonly refresh: Effect.Effect<void>
  }
>()("router/market/Providers") {
  static readonly layer = Layer.effect(
    Providers,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      let cache = new Map<string, Provider>()

      const load =
        sql`SELECT provider_id, signer, base_url, dialect, enabled FROM providers ORDER BY provider_id`.pipe(
          Effect.flatMap(decodeRows),
          Effect.orDie
        )
      const refresh = Effect.map(load, (rows) => {
        cache = new Map(rows.map((p) => [p.provider_id, p]))
      })

      const register = Effect.fn("Providers.register")(function* (registration: ProviderRegistration) {
        yield* Effect.annotateCurrentSpan({
          provider_id: registration.provider_id,
          dialect: registration.dialect
        })
        const signer = getAddress(registration.signer)
        yield* sql`
          INSERT INTO providers (provider_id, signer, base_url, dialect)
          VALUES (${registration.provider_id}, ${signer}, ${registration.base_url}, ${registration.dialect})
          ON CONFLICT (provider_id) DO UPDATE
          SET signer = EXCLUDED.signer, base_url = EXCLUDED.base_url, dialect = EXCLUDED.dialect, updated_at = now()
        `.pipe(Effect.orDie)
        yield* refresh
        return cache.get(registration.provider_id)!
      })

      const setEnabled = Effect.fn("Providers.setEnabled")(function* (providerId: string, enabled: boolean) {
        const rows = yield* sql`
          UPDATE providers SET enabled = ${enabled}, updated_at = now() WHERE provider_id = ${providerId}
          RETURNING provider_id
        `.pipe(Effect.orDie)
        if (rows.length === 0) {
          return yield* new NotFound({ code: "provider_not_found", message: `No provider ${providerId}` })
        }
        yield* refresh
        return cache.get(providerId)!
      })

      yield* refresh
      return Providers.of({
        register,
        list: Effect.map(load, (rows) => rows),
        setEnabled,
        get: (providerId) => cache.get(providerId),
        refresh
      })
    })
  )

  /** A fixed registry, for tests of what reads it. */
  static readonly layerTest = (registered: ReadonlyArray<Provider>) =>
    Layer.succeed(
      Providers,
      Providers.of({
        register: () => Effect.die("Providers.layerTest does not register"),
        list: Effect.succeed(registered),
        setEnabled: () => Effect.die("Providers.layerTest does not change providers"),
        get: (providerId) => registered.find((p) => p.provider_id === providerId),
        refresh: Effect.void
      })
    )
}
