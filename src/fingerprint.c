/*-------------------------------------------------------------------------
 *
 * fingerprint.c
 *		idem_fingerprint(): SHA-256 digests of requests, computed in the server.
 *
 * A fingerprint binds an idempotency key to one request.  The text and bytea
 * forms hash the bytes as given, so a client can compute the same digest
 * itself.  The jsonb form hashes the canonical text of the value (the jsonb
 * output: keys sorted, duplicates removed, whitespace normalized), so key
 * order and formatting do not change the fingerprint.  Numbers keep their
 * written scale: 1.0 and 1.00 are different requests.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/cryptohash.h"
#include "common/sha2.h"
#include "lib/stringinfo.h"
#include "utils/jsonb.h"

#include "idempotency.h"

PG_FUNCTION_INFO_V1(idem_fingerprint_jsonb);
PG_FUNCTION_INFO_V1(idem_fingerprint_text);
PG_FUNCTION_INFO_V1(idem_fingerprint_bytea);

static bytea *
sha256_bytea(const char *data, size_t len)
{
	pg_cryptohash_ctx *ctx = pg_cryptohash_create(PG_SHA256);
	bytea	   *digest = palloc(VARHDRSZ + PG_SHA256_DIGEST_LENGTH);

	if (pg_cryptohash_init(ctx) < 0 ||
		pg_cryptohash_update(ctx, (const uint8 *) data, len) < 0 ||
		pg_cryptohash_final(ctx, (uint8 *) VARDATA(digest),
							PG_SHA256_DIGEST_LENGTH) < 0)
		elog(ERROR, "could not compute SHA-256 digest: %s",
			 pg_cryptohash_error(ctx));
	pg_cryptohash_free(ctx);

	SET_VARSIZE(digest, VARHDRSZ + PG_SHA256_DIGEST_LENGTH);
	return digest;
}

Datum
idem_fingerprint_jsonb(PG_FUNCTION_ARGS)
{
	Jsonb	   *request = PG_GETARG_JSONB_P(0);
	StringInfoData canonical;

	initStringInfo(&canonical);
	JsonbToCString(&canonical, &request->root, VARSIZE(request));
	PG_RETURN_BYTEA_P(sha256_bytea(canonical.data, canonical.len));
}

Datum
idem_fingerprint_text(PG_FUNCTION_ARGS)
{
	text	   *request = PG_GETARG_TEXT_PP(0);

	PG_RETURN_BYTEA_P(sha256_bytea(VARDATA_ANY(request), VARSIZE_ANY_EXHDR(request)));
}

Datum
idem_fingerprint_bytea(PG_FUNCTION_ARGS)
{
	bytea	   *request = PG_GETARG_BYTEA_PP(0);

	PG_RETURN_BYTEA_P(sha256_bytea(VARDATA_ANY(request), VARSIZE_ANY_EXHDR(request)));
}
