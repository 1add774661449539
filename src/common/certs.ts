// @peculiar/x509 resolves its services through tsyringe, which needs the Reflect metadata API.
import "reflect-metadata";
import { webcrypto } from "node:crypto";

type CryptoKey = webcrypto.CryptoKey;
type CryptoKeyPair = webcrypto.CryptoKeyPair;
import * as x509 from "@peculiar/x509";

// The library speaks the web Crypto API; Node ships one.
x509.cryptoProvider.set(webcrypto as unknown as Parameters<typeof x509.cryptoProvider.set>[0]);

const ALG = { name: "ECDSA", namedCurve: "P-256", hash: "SHA-256" } as const;
const DAY = 86_400_000;

export interface Pem {
  cert: string;
  key: string;
}

export interface Issuer extends Pem {
  keys: CryptoKeyPair;
  name: string;
}

async function keyPem(key: CryptoKey): Promise<string> {
  const der = Buffer.from(await webcrypto.subtle.exportKey("pkcs8", key));
  return x509.PemConverter.encode(der, "PRIVATE KEY");
}

/** A fresh certificate authority (ECDSA P-256), valid for a year. */
export async function createCA(commonName: string): Promise<Issuer> {
  const keys = await webcrypto.subtle.generateKey(ALG, true, ["sign", "verify"]);
  const name = `CN=${commonName}`;
  const cert = await x509.X509CertificateGenerator.createSelfSigned({
    name,
    keys,
    notBefore: new Date(Date.now() - DAY),
    notAfter: new Date(Date.now() + 365 * DAY),
    signingAlgorithm: ALG,
    extensions: [
      new x509.BasicConstraintsExtension(true, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
      await x509.SubjectKeyIdentifierExtension.create(keys.publicKey),
    ],
  });
  return { cert: cert.toString("pem"), key: await keyPem(keys.privateKey), keys, name };
}

export interface LeafOptions {
  commonName: string;
  organization?: string;
  /** DNS names and IP addresses for a serving certificate. */
  dns?: string[];
  ips?: string[];
  usage: "server" | "client" | "both";
}

/** A leaf certificate signed by `ca`. */
export async function issueCert(ca: Issuer, opts: LeafOptions): Promise<Pem> {
  const keys = await webcrypto.subtle.generateKey(ALG, true, ["sign", "verify"]);
  const eku =
    opts.usage === "server"
      ? [x509.ExtendedKeyUsage.serverAuth]
      : opts.usage === "client"
        ? [x509.ExtendedKeyUsage.clientAuth]
        : [x509.ExtendedKeyUsage.serverAuth, x509.ExtendedKeyUsage.clientAuth];
  const extensions: x509.Extension[] = [
    new x509.BasicConstraintsExtension(false, undefined, true),
    new x509.KeyUsagesExtension(
      x509.KeyUsageFlags.digitalSignature | x509.KeyUsageFlags.keyEncipherment,
      true,
    ),
    new x509.ExtendedKeyUsageExtension(eku),
    await x509.AuthorityKeyIdentifierExtension.create(ca.keys.publicKey),
  ];
  const san = [
    ...(opts.dns ?? []).map((value) => ({ type: "dns" as const, value })),
    ...(opts.ips ?? []).map((value) => ({ type: "ip" as const, value })),
  ];
  if (san.length) extensions.push(new x509.SubjectAlternativeNameExtension(san));
  const subject = `CN=${opts.commonName}${opts.organization ? `, O=${opts.organization}` : ""}`;
  const cert = await x509.X509CertificateGenerator.create({
    subject,
    issuer: ca.name,
    publicKey: keys.publicKey,
    signingKey: ca.keys.privateKey,
    notBefore: new Date(Date.now() - DAY),
    notAfter: new Date(Date.now() + 365 * DAY),
    signingAlgorithm: ALG,
    extensions,
  });
  return { cert: cert.toString("pem"), key: await keyPem(keys.privateKey) };
}

/** An RSA key pair in PEM (service-account token signing needs a key the API server can verify). */
export async function createSigningKeyPair(): Promise<{ privateKey: string; publicKey: string }> {
  const { generateKeyPairSync } = await import("node:crypto");
  const { privateKey, publicKey } = generateKeyPairSync("rsa", {
    modulusLength: 2048,
    privateKeyEncoding: { type: "pkcs8", format: "pem" },
    publicKeyEncoding: { type: "spki", format: "pem" },
  });
  return { privateKey, publicKey };
}
