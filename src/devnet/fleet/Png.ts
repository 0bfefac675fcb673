import { createHash } from "node:crypto"
import { crc32, deflateSync } from "node:zlib"
import type { ImageSize } from "../../domain/Images.ts"

/**
 * The simulated image model: a real PNG (8-bit RGB, one IDAT, no filtering) of a pattern
 * drawn from the prompt's hash. Same prompt and size, same bytes; no image library.
 */

export const PNG_SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])

/** The side in pixels of each size the images API offers (`domain/Images.ts`). */
export const imageSizes: Readonly<Record<ImageSize, number>> = {
  "256x256": 256,
  "512x512": 512,
  "1024x1024": 1024
}

const chunk = (type: string, data: Buffer): Buffer => {
  const length = Buffer.alloc(4)
  length.writeUInt32BE(data.length)
  const body = Buffer.concat([Buffer.from(type, "ascii"), data])
  const crc = Buffer.alloc(4)
  crc.writeUInt32BE(crc32(body) >>> 0)
  return Buffer.concat([length, body, crc])
}

/** Encodes `width x height` RGB pixels (row-major, 3 bytes each) as a PNG file. */
export const encodePng = (width: number, height: number, rgb: Uint8Array): Buffer => {
  if (rgb.length !== width * height * 3) throw new RangeError("pixel buffer does not match the size")
  const header = Buffer.alloc(13)
  header.writeUInt32BE(width, 0)
  header.writeUInt32BE(height, 4)
  header[8] = 8 // bit depth
  header[9] = 2 // colour type: truecolour
  const stride = width * 3
  const raw = Buffer.alloc((stride + 1) * height)
  for (let y = 0; y < height; y++) {
    // Filter type 0 (none) leads each scanline.
    raw.set(rgb.subarray(y * stride, (y + 1) * stride), y * (stride + 1) + 1)
  }
  return Buffer.concat([
    PNG_SIGNATURE,
    chunk("IHDR", header),
    chunk("IDAT", deflateSync(raw)),
    chunk("IEND", Buffer.alloc(0))
  ])
}

/** Rings around a point and diagonal bands, in three colours, all chosen by the prompt. */
export const renderPrompt = (prompt: string, size: ImageSize): Buffer => {
  const side = imageSizes[size]
  const seed = createHash("sha256").update(prompt).digest()
  const colours = [seed.subarray(0, 3), seed.subarray(3, 6), seed.subarray(6, 9)]
  const cx = (seed[9]! / 255) * side
  const cy = (seed[10]! / 255) * side
  const ring = (8 + (seed[11]! % 24)) * (side / 256)
  const band = (6 + (seed[12]! % 20)) * (side / 256)
  const pixels = new Uint8Array(side * side * 3)
  for (let y = 0; y < side; y++) {
    for (let x = 0; x < side; x++) {
      const inRing = Math.floor(Math.hypot(x - cx, y - cy) / ring) % 2 === 0
      const inBand = Math.floor((x + y) / band) % 3 === 0
      const colour = inBand ? colours[2]! : inRing ? colours[0]! : colours[1]!
      pixels.set(colour, (y * side + x) * 3)
    }
  }
  return encodePng(side, side, pixels)
}
