/*-------------------------------------------------------------------------
 *
 * fingerprint.h
 *		SHA-256 digests (fingerprint.c).
 *
 * A pure function: no lock, no state; the digest is palloc'd in the
 * current memory context.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_FINGERPRINT_H
#define IDEM_FINGERPRINT_H

/* fingerprint.c */
extern bytea *idem_sha256(const char *data, size_t len);

#endif							/* IDEM_FINGERPRINT_H */
