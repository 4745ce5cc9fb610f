// The web companion's device key: an Ed25519 pair made by WebCrypto with a non-extractable
// private half, kept in IndexedDB, so steer commands are signed on the phone and nowhere else.
import { del, get, set } from "idb-keyval";

/** This device's signing key: its public half as the pairing request wants it, and a signer. */
export interface DeviceKey {
  /** The raw 32-byte Ed25519 public key, base64url without padding (`PairDevice.public_key`). */
  publicKey: string;
  /** An Ed25519 signature (64 bytes) over `data`. */
  sign(data: Uint8Array): Promise<Uint8Array<ArrayBuffer>>;
}

/** Where the key pair is kept: IndexedDB by default; tests pass a map. */
export interface KeyStore {
  get(key: string): Promise<unknown>;
  set(key: string, value: unknown): Promise<void>;
  del(key: string): Promise<void>;
}

/** IndexedDB through idb-keyval: CryptoKey objects are structured-cloneable, so the private
 * key is stored without ever being exported. */
export const indexedDbStore: KeyStore = {
  get: (key) => get(key),
  set: (key, value) => set(key, value),
  del: (key) => del(key),
};

/** The store entry holding the CryptoKeyPair. */
export const KEY_NAME = "waymark.device-key";

const ED25519 = { name: "Ed25519" } as const;

/** The browser has no WebCrypto, or no Ed25519 in it. */
export class UnsupportedBrowserError extends Error {
  constructor(detail: string) {
    super(detail);
    this.name = "UnsupportedBrowserError";
  }
}

/** base64url without padding (RFC 4648 §5), as the server writes keys and signatures. */
export function base64url(bytes: Uint8Array): string {
  let s = "";
  for (const b of bytes) s += String.fromCharCode(b);
  return btoa(s).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function subtle(): SubtleCrypto {
  const s = globalThis.crypto?.subtle;
  if (!s) {
    throw new UnsupportedBrowserError(
      "this page cannot use WebCrypto to make a device key: open the companion over https:// (or on localhost)",
    );
  }
  return s;
}

function isKeyPair(v: unknown): v is CryptoKeyPair {
  if (typeof v !== "object" || v === null) return false;
  const { privateKey, publicKey } = v as Partial<CryptoKeyPair>;
  return (
    privateKey?.type === "private" &&
    publicKey?.type === "public" &&
    privateKey.algorithm.name === ED25519.name &&
    publicKey.algorithm.name === ED25519.name
  );
}

async function generate(): Promise<CryptoKeyPair> {
  try {
    // Non-extractable: the private half can sign but never be read out, not even by this page.
    return (await subtle().generateKey(ED25519, false, ["sign", "verify"])) as CryptoKeyPair;
  } catch (e) {
    if (e instanceof UnsupportedBrowserError) throw e;
    throw new UnsupportedBrowserError(
      "this browser cannot make an Ed25519 device key; use a current Chrome, Edge, Firefox or Safari" +
        (e instanceof Error ? ` (${e.name}: ${e.message})` : ""),
    );
  }
}

async function deviceKey(pair: CryptoKeyPair): Promise<DeviceKey> {
  // A public key is exportable even when its pair was generated non-extractable.
  const raw = new Uint8Array(await subtle().exportKey("raw", pair.publicKey));
  return {
    publicKey: base64url(raw),
    sign: async (data) =>
      new Uint8Array(await subtle().sign(ED25519, pair.privateKey, Uint8Array.from(data))),
  };
}

/** This device's key: the stored one, or a new one, stored before it is returned. */
export async function loadOrCreateKey(store: KeyStore = indexedDbStore): Promise<DeviceKey> {
  const stored = await store.get(KEY_NAME);
  if (stored !== undefined) {
    if (!isKeyPair(stored)) {
      throw new Error(
        `the stored device key is not an Ed25519 key pair: forget it (forgetKey) and pair this device again`,
      );
    }
    return deviceKey(stored);
  }
  const pair = await generate();
  await store.set(KEY_NAME, pair);
  return deviceKey(pair);
}

/** A key for a pairing not yet accepted: made, not stored; `keep` stores it once the server
 * took it, so a refused pairing leaves the key this device is paired with in place. */
export async function pendingKey(store: KeyStore = indexedDbStore): Promise<DeviceKey & { keep(): Promise<void> }> {
  const pair = await generate();
  return { ...(await deviceKey(pair)), keep: () => store.set(KEY_NAME, pair) };
}

/** Forgets this device's key; a new pairing makes a new one. The server still knows the old
 * public key until the device is revoked there. */
export async function forgetKey(store: KeyStore = indexedDbStore): Promise<void> {
  await store.del(KEY_NAME);
}
