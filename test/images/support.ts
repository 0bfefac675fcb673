import { crc32, inflateSync } from "node:zlib"
import { ConfigProvider, Layer } from "effect"
import { imageStandardClass } from "../../src/inference/Images.ts"
import { defaultCatalog } from "../../src/market/Catalog.ts"
import { routerWithFleet } from "../support/Router.ts"

export interface DecodedPng {
  readonly width: number
  readonly height: number
  readonly bitDepth: number
  readonly colourType: number
  /** RGB bytes, row-major, filter bytes removed. */
  readonly pixels: Buffer
}

/**
 * A strict reader for the PNGs the simulated fleet writes (8-bit RGB, filter 0): it checks the
 * signature, every chunk's CRC and the chunk order, and inflates the image data.
 */
export const decodePng = (file: Buffer): DecodedPng => {
  if (file.subarray(0, 8).toString("hex") !== "89504e470d0a1a0a") throw new Error("not a PNG signature")
  let offset = 8
  const types: Array<string> = []
  let header: Buffer | undefined
  const data: Array<Buffer> = []
  while (offset < file.length) {
    const length = file.readUInt32BE(offset)
    const type = file.subarray(offset + 4, offset + 8).toString("ascii")
    const body = file.subarray(offset + 8, offset + 8 + length)
    const crc = file.readUInt32BE(offset + 8 + length)
    if (crc32(file.subarray(offset + 4, offset + 8 + length)) >>> 0 !== crc)
      throw new Error(`bad CRC in ${type}`)
    types.push(type)
    if (type === "IHDR") header = body
    if (type === "IDAT") data.push(body)
    offset += 12 + length
  }
  if (types[0] !== "IHDR" || types.at(-1) !== "IEND" || header === undefined)
    throw new Error("bad chunk order")
  const width = header.readUInt32BE(0)
  const height = header.readUInt32BE(4)
  const raw = inflateSync(Buffer.concat(data))
  const stride = width * 3
  if (raw.length !== (stride + 1) * height) throw new Error("image data has the wrong length")
  const pixels = Buffer.alloc(stride * height)
  for (let y = 0; y < height; y++) {
    if (raw[y * (stride + 1)] !== 0) throw new Error("unexpected filter")
    raw.copy(pixels, y * stride, y * (stride + 1) + 1, (y + 1) * (stride + 1))
  }
  return { width, height, bitDepth: header[8]!, colourType: header[9]!, pixels }
}

/** The default catalog with the image class (whether or not the default already lists it). */
export const catalogWithImages = defaultCatalog.some((c) => c.id === imageStandardClass.id)
  ? defaultCatalog
  : [...defaultCatalog, imageStandardClass]

/** The router and fleet with an image class in the catalog. */
export const routerWithImages = () =>
  routerWithFleet().pipe(
    Layer.provide(
      ConfigProvider.layerAdd(
        ConfigProvider.fromUnknown({ MODEL_CATALOG_JSON: JSON.stringify(catalogWithImages) }),
        { asPrimary: true }
      )
    )
  )
