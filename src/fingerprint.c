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
 * idem_request_fingerprint() binds a key to an HTTP request: its method,
 * path and canonical body, less the parts of the body named by the ignore
 * paths.  The digest's input is a version byte and the three fields, each
 * preceded by its length, so that no two different requests give the same
 * input (README, "Fingerprints", has the layout).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "common/cryptohash.h"
#include "common/sha2.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "port/pg_bswap.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"

#include "fingerprint.h"
#include "validation.h"

PG_FUNCTION_INFO_V1(idem_fingerprint_jsonb);
PG_FUNCTION_INFO_V1(idem_fingerprint_text);
PG_FUNCTION_INFO_V1(idem_fingerprint_bytea);
PG_FUNCTION_INFO_V1(idem_request_fingerprint);

/*
 * The first byte of idem_request_fingerprint's input.  A change of the
 * layout or of the canonical form takes the next number, so that digests of
 * the old scheme can never equal those of the new one.
 */
#define IDEM_REQUEST_FINGERPRINT_VERSION	1

/* A run of bytes of the digest's input. */
typedef struct HashPiece
{
	const void *data;
	size_t		len;
} HashPiece;

/* The SHA-256 digest of the pieces, one after the other. */
static bytea *
sha256_pieces(const HashPiece *pieces, int npieces)
{
	pg_cryptohash_ctx *ctx = pg_cryptohash_create(PG_SHA256);
	bytea	   *digest = palloc(VARHDRSZ + PG_SHA256_DIGEST_LENGTH);
	bool		ok;

	ok = pg_cryptohash_init(ctx) == 0;
	for (int i = 0; ok && i < npieces; i++)
		ok = pg_cryptohash_update(ctx, (const uint8 *) pieces[i].data,
								  pieces[i].len) == 0;
	if (!ok ||
		pg_cryptohash_final(ctx, (uint8 *) VARDATA(digest),
							PG_SHA256_DIGEST_LENGTH) < 0)
		elog(ERROR, "could not compute SHA-256 digest: %s",
			 pg_cryptohash_error(ctx));
	pg_cryptohash_free(ctx);

	SET_VARSIZE(digest, VARHDRSZ + PG_SHA256_DIGEST_LENGTH);
	return digest;
}

/* The SHA-256 digest of len bytes at data (also for src/route.c). */
bytea *
idem_sha256(const char *data, size_t len)
{
	HashPiece	piece = {data, len};

	return sha256_pieces(&piece, 1);
}

Datum
idem_fingerprint_jsonb(PG_FUNCTION_ARGS)
{
	Jsonb	   *request = PG_GETARG_JSONB_P(0);
	StringInfoData canonical;

	initStringInfo(&canonical);
	JsonbToCString(&canonical, &request->root, VARSIZE(request));
	PG_RETURN_BYTEA_P(idem_sha256(canonical.data, canonical.len));
}

Datum
idem_fingerprint_text(PG_FUNCTION_ARGS)
{
	text	   *request = PG_GETARG_TEXT_PP(0);

	PG_RETURN_BYTEA_P(idem_sha256(VARDATA_ANY(request), VARSIZE_ANY_EXHDR(request)));
}

Datum
idem_fingerprint_bytea(PG_FUNCTION_ARGS)
{
	bytea	   *request = PG_GETARG_BYTEA_PP(0);

	PG_RETURN_BYTEA_P(idem_sha256(VARDATA_ANY(request), VARSIZE_ANY_EXHDR(request)));
}

/*
 * idem_request_fingerprint(method, path, body, ignore)
 *
 * The ignore paths are parsed into a tree of keys, so that the body is
 * copied once whatever their number: a key whose node ends a path is left
 * out with its value, a key with a node below it is followed if its value is
 * an object, and everything else is copied as it is.  Arrays and scalars are
 * never entered, so a path that meets one before its end removes nothing,
 * like a path that is missing.
 */
typedef struct IgnoreNode
{
	const char *key;
	int			keylen;
	bool		removed;		/* a path ends here: leave the key out */
	struct IgnoreNode *children;
	struct IgnoreNode *next;	/* the next child of the same parent */
} IgnoreNode;

static IgnoreNode *
ignore_child(const IgnoreNode *node, const char *key, int keylen)
{
	for (IgnoreNode *child = node->children; child != NULL; child = child->next)
		if (child->keylen == keylen && memcmp(child->key, key, keylen) == 0)
			return child;
	return NULL;
}

static void
ignore_add(IgnoreNode *root, text *path_text)
{
	const char *path = VARDATA_ANY(path_text);
	int			len = VARSIZE_ANY_EXHDR(path_text);
	IgnoreNode *node = root;
	int			start = 0;

	for (int i = 0; i <= len; i++)
	{
		IgnoreNode *child;

		if (i < len && path[i] != '.')
			continue;
		if (i == start)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid ignore path \"%s\"", text_to_cstring(path_text)),
					 errdetail("An ignore path is one or more keys separated by dots, and no key may be empty.")));
		child = ignore_child(node, path + start, i - start);
		if (child == NULL)
		{
			child = palloc0(sizeof(IgnoreNode));
			child->key = path + start;
			child->keylen = i - start;
			child->next = node->children;
			node->children = child;
		}
		node = child;
		start = i + 1;
	}
	node->removed = true;
}

/*
 * Push the object in container to state, less the keys that node removes.
 * Returns what the last push returned: the whole value, at the outermost
 * level.
 */
static JsonbValue *
copy_without(JsonbParseState **state, JsonbContainer *container,
			 const IgnoreNode *node)
{
	JsonbIterator *it = JsonbIteratorInit(container);
	JsonbIteratorToken tok;
	JsonbValue	v;
	JsonbValue *result = NULL;

	check_stack_depth();

	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		JsonbValue	key;
		const IgnoreNode *child;

		if (tok != WJB_KEY)
		{
			/* the object's own WJB_BEGIN_OBJECT and WJB_END_OBJECT */
			result = pushJsonbValue(state, tok, NULL);
			continue;
		}
		key = v;
		child = ignore_child(node, key.val.string.val, key.val.string.len);
		tok = JsonbIteratorNext(&it, &v, true);
		Assert(tok == WJB_VALUE);
		if (child != NULL && child->removed)
			continue;
		pushJsonbValue(state, WJB_KEY, &key);
		if (child != NULL && v.type == jbvBinary &&
			JsonContainerIsObject(v.val.binary.data))
			copy_without(state, v.val.binary.data, child);
		else
			pushJsonbValue(state, WJB_VALUE, &v);
	}
	return result;
}

/* The body less the ignore paths (argument argno, NULL for none). */
static Jsonb *
body_without(FunctionCallInfo fcinfo, Jsonb *body, int argno)
{
	ArrayType  *paths;
	Datum	   *elems;
	bool	   *nulls;
	int			npaths;
	IgnoreNode	root = {0};
	JsonbParseState *state = NULL;

	if (PG_ARGISNULL(argno))
		return body;
	paths = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(paths) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ignore must be a one-dimensional array")));
	deconstruct_array(paths, TEXTOID, -1, false, TYPALIGN_INT,
					  &elems, &nulls, &npaths);
	for (int i = 0; i < npaths; i++)
	{
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("ignore must not contain nulls")));
		ignore_add(&root, DatumGetTextPP(elems[i]));
	}

	/* only an object has keys to remove */
	if (root.children == NULL || !JB_ROOT_IS_OBJECT(body))
		return body;
	return JsonbValueToJsonb(copy_without(&state, &body->root, &root));
}

/* An HTTP method is a token (RFC 9110, section 5.6.2). */
static bool
is_token_char(unsigned char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
		(c >= '0' && c <= '9') ||
		(c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

Datum
idem_request_fingerprint(PG_FUNCTION_ARGS)
{
	text	   *method_text;
	text	   *path;
	Jsonb	   *body;
	char	   *method;
	int			method_len;
	StringInfoData canonical;
	char	   *path_utf8;
	size_t		path_utf8_len;
	char	   *body_utf8;
	size_t		body_utf8_len;
	uint8		version = IDEM_REQUEST_FINGERPRINT_VERSION;
	uint32		method_len_be;
	uint32		path_len_be;
	uint32		body_len_be;
	HashPiece	pieces[7];

	idem_arg_not_null(fcinfo, 0, "method");
	idem_arg_not_null(fcinfo, 1, "path");
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("body must not be null"),
				 errhint("Pass 'null'::jsonb for a request without a body.")));

	method_text = PG_GETARG_TEXT_PP(0);
	method_len = VARSIZE_ANY_EXHDR(method_text);
	if (method_len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("method must not be empty")));
	method = palloc(method_len);
	for (int i = 0; i < method_len; i++)
	{
		unsigned char c = VARDATA_ANY(method_text)[i];

		if (!is_token_char(c))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid HTTP method \"%s\"", text_to_cstring(method_text)),
					 errdetail("A method consists of letters, digits and the characters !#$%%&'*+-.^_`|~.")));
		method[i] = pg_ascii_toupper(c);
	}
	path = PG_GETARG_TEXT_PP(1);
	body = body_without(fcinfo, PG_GETARG_JSONB_P(2), 3);

	initStringInfo(&canonical);
	JsonbToCString(&canonical, &body->root, VARSIZE(body));

	/*
	 * Path and body are hashed in UTF-8 whatever the database's encoding, so
	 * that a client, or a database in another encoding, gets the same digest.
	 * The conversion returns its input when there is nothing to convert.
	 */
	path_utf8 = pg_server_to_any(VARDATA_ANY(path), VARSIZE_ANY_EXHDR(path), PG_UTF8);
	path_utf8_len = path_utf8 == VARDATA_ANY(path) ? (size_t) VARSIZE_ANY_EXHDR(path) : strlen(path_utf8);
	body_utf8 = pg_server_to_any(canonical.data, canonical.len, PG_UTF8);
	body_utf8_len = body_utf8 == canonical.data ? (size_t) canonical.len : strlen(body_utf8);

	/* lengths in network byte order, as the README documents */
	method_len_be = pg_hton32((uint32) method_len);
	path_len_be = pg_hton32((uint32) path_utf8_len);
	body_len_be = pg_hton32((uint32) body_utf8_len);
	pieces[0] = (HashPiece) {&version, 1};
	pieces[1] = (HashPiece) {&method_len_be, 4};
	pieces[2] = (HashPiece) {method, method_len};
	pieces[3] = (HashPiece) {&path_len_be, 4};
	pieces[4] = (HashPiece) {path_utf8, path_utf8_len};
	pieces[5] = (HashPiece) {&body_len_be, 4};
	pieces[6] = (HashPiece) {body_utf8, body_utf8_len};

	PG_RETURN_BYTEA_P(sha256_pieces(pieces, lengthof(pieces)));
}
