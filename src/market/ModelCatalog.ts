import { Config, Context, Effect, Layer, Option } from "effect"
import { type Catalog, decodeCatalog, defaultCatalog, findClass, type ModelClass } from "./Catalog.ts"

/** The model-class catalog: `MODEL_CATALOG_JSON` when set, else the default classes. */
export class ModelCatalog extends Context.Service<
  ModelCatalog,
  { readonly classes: Catalog; readonly find: (id: string) => ModelClass | undefined }
>()("router/market/ModelCatalog") {
  static readonly make = (classes: Catalog) =>
    ModelCatalog.of({ classes, find: (id) => findClass(classes, id) })

  static readonly layer = Layer.effect(
    ModelCatalog,
    Effect.gen(function* () {
      const json = yield* Config.String("MODEL_CATALOG_JSON").pipe(Config.option)
      if (Option.isNone(json)) return ModelCatalog.make(defaultCatalog)
      return ModelCatalog.make(yield* Effect.orDie(decodeCatalog(json.value)))
    })
  )

  static readonly layerDefault = Layer.succeed(ModelCatalog, ModelCatalog.make(defaultCatalog))
}
