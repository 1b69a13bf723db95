/*-------------------------------------------------------------------------
 *
 * route.c
 *		idem_route_hash(): the shard of a scope, the same on every server.
 *
 * Sharded deployments (PL/Proxy's RUN ON) route each call by an integer
 * hash of the scope.  Everything of one tenant must land on one shard, so
 * the hash covers only the scope's tenant part, the text before the first
 * '/' (the rule of tenant isolation: "t1" and "t1/orders" are one tenant).
 * It must never change: a proxy and its shards may run different major
 * versions and CPU architectures, and a changed hash would strand every
 * key on the wrong shard.  So it is not hashtext() (changed between major
 * versions) but the first four bytes of the SHA-256 digest of the tenant's
 * UTF-8 bytes, read as a big-endian signed 32-bit integer, which plain SQL
 * computes too:
 *
 *	('x' || left(encode(sha256(convert_to(split_part(scope, '/', 1), 'UTF8')),
 *	 'hex'), 8))::bit(32)::int
 *
 * sql/route_hash.sql checks it against fixed vectors and that SQL form.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "mb/pg_wchar.h"
#include "port/pg_bswap.h"
#include "utils/builtins.h"

#include "fingerprint.h"
#include "pg_compat.h"
#include "validation.h"

PG_FUNCTION_INFO_V1(idem_route_hash);

Datum
idem_route_hash(PG_FUNCTION_ARGS)
{
	text	   *scope = idem_arg_scope(fcinfo, 0);
	const char *data = VARDATA_ANY(scope);
	int			len = VARSIZE_ANY_EXHDR(scope);
	const char *slash;
	char	   *utf8;
	size_t		utf8_len;
	bytea	   *digest;
	uint32		first;

	/* '/' is ASCII, so it is never part of a multibyte character */
	slash = memchr(data, '/', len);
	if (slash != NULL)
		len = slash - data;
	utf8 = pg_server_to_any(data, len, PG_UTF8);
	utf8_len = utf8 == data ? (size_t) len : strlen(utf8);
	digest = idem_sha256(utf8, utf8_len);
	memcpy(&first, VARDATA(digest), sizeof(first));
	PG_RETURN_INT32((int32) pg_ntoh32(first));
}
