/*-------------------------------------------------------------------------
 *
 * validation.c
 *		Argument checks shared by the SQL-callable functions.
 *
 * The functions are not STRICT: a NULL where a value is required is an
 * error (22004) rather than a silent NULL result, and every check runs
 * before anything is read or written.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "idempotency.h"
#include "validation.h"

void
idem_arg_not_null(FunctionCallInfo fcinfo, int argno, const char *name)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", name)));
}

static void
check_length(text *value, const char *what)
{
	int			len = VARSIZE_ANY_EXHDR(value);

	if (len > idem_max_key_length)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("%s is too long", what),
				 errdetail("It is %d bytes long; idempotency.max_key_length is %d.",
						   len, idem_max_key_length)));
}

text *
idem_arg_key(FunctionCallInfo fcinfo, int argno, const char *what)
{
	text	   *key;

	idem_arg_not_null(fcinfo, argno, what);
	key = PG_GETARG_TEXT_PP(argno);
	if (VARSIZE_ANY_EXHDR(key) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", what)));
	check_length(key, what);
	return key;
}

text *
idem_arg_scope(FunctionCallInfo fcinfo, int argno)
{
	text	   *scope;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("scope must not be null"),
				 errhint("Use '' for the default scope.")));
	scope = PG_GETARG_TEXT_PP(argno);
	check_length(scope, "scope");
	return scope;
}

bytea *
idem_arg_fingerprint(FunctionCallInfo fcinfo, int argno)
{
	bytea	   *fingerprint;
	int			len;

	idem_arg_not_null(fcinfo, argno, "fingerprint");
	fingerprint = PG_GETARG_BYTEA_PP(argno);
	len = VARSIZE_ANY_EXHDR(fingerprint);
	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("fingerprint must not be empty"),
				 errhint("Pass idem_fingerprint(request), a SHA-256 digest of the request.")));
	if (len > IDEM_MAX_FINGERPRINT_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("fingerprint is too long"),
				 errdetail("It is %d bytes long; a fingerprint is a digest of at most %d bytes.",
						   len, IDEM_MAX_FINGERPRINT_BYTES),
				 errhint("Pass idem_fingerprint(request), a SHA-256 digest of the request.")));
	return fingerprint;
}

int64
idem_arg_token(FunctionCallInfo fcinfo, int argno)
{
	int64		token;

	idem_arg_not_null(fcinfo, argno, "token");
	token = PG_GETARG_INT64(argno);
	if (token <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("token must be positive"),
				 errdetail("Fencing tokens start at 1; %lld was given.",
						   (long long) token)));
	return token;
}

/*
 * base + span, which must lie after base: an interval such as
 * '1 day -25 hours' is as non-positive as '0'.  It must be finite too
 * (intervals may be infinite from PostgreSQL 17 on): an infinite lease could
 * never be taken over after a crash, an infinite retention never purged.
 */
TimestampTz
idem_add_interval(TimestampTz base, Interval *span, const char *name)
{
	TimestampTz result;

	result = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
													 TimestampTzGetDatum(base),
													 IntervalPGetDatum(span)));
	if (result <= base)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be positive", name),
				 errdetail("The interval given was \"%s\".",
						   DatumGetCString(DirectFunctionCall1(interval_out,
															   IntervalPGetDatum(span))))));
	if (TIMESTAMP_NOT_FINITE(result))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be finite", name)));
	return result;
}

/*
 * The expiry of something kept for the retention given in argument argno,
 * or for idempotency.retention when that is NULL.
 */
TimestampTz
idem_retention_expiry(FunctionCallInfo fcinfo, int argno, TimestampTz now)
{
	if (PG_ARGISNULL(argno))
		return now + (int64) idem_retention_s * USECS_PER_SEC;
	return idem_add_interval(now, PG_GETARG_INTERVAL_P(argno), "retention");
}

/*
 * An HTTP field name is a token (RFC 9110, section 5.6.2): letters, digits
 * and !#$%&'*+-.^_`|~.
 */
static bool
is_token_char(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		(c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

static void
value_not_string(const char *name)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("value of header \"%s\" must be a string or an array of strings", name),
			 errhint("Save a header with several values as an array of strings, one per value.")));
}

/*
 * A field value is sent again as it was saved, so it must be one that every
 * server can send: visible ASCII, spaces and tabs (RFC 9110, section 5.5,
 * without the obsolete bytes above 0x7f, which servers such as Node.js
 * refuse).  A line break would end the field, and let a value add fields.
 */
static void
check_header_value(const char *name, JsonbValue *value)
{
	if (value->type != jbvString)
		value_not_string(name);
	for (int i = 0; i < value->val.string.len; i++)
	{
		unsigned char c = (unsigned char) value->val.string.val[i];

		if (c == '\r' || c == '\n')
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("value of header \"%s\" contains a line break", name),
					 errdetail("Header values cannot contain CR or LF characters.")));
		if (c != '\t' && (c < 0x20 || c > 0x7e))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("value of header \"%s\" contains a character that cannot be sent", name),
					 errdetail("Header values consist of visible ASCII characters, spaces and tabs."),
					 errhint("Encode other text, for example as RFC 8187 does.")));
	}
}

/*
 * Fields the server writes for each answer it sends: the framing of the body
 * and the connection's own (RFC 9110, section 7.6.1).  Saved, they would be
 * sent again beside the server's own and contradict them.
 */
static const char *const unsaved_headers[] = {
	"Connection", "Content-Length", "Keep-Alive", "Proxy-Connection", "TE",
	"Trailer", "Transfer-Encoding", "Upgrade",
};

static void
check_header_name_saved(const char *name)
{
	for (size_t i = 0; i < lengthof(unsaved_headers); i++)
		if (pg_strcasecmp(name, unsaved_headers[i]) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("header \"%s\" cannot be saved", name),
					 errdetail("The server writes it for each answer it sends: Content-Length and Transfer-Encoding frame the body, the others belong to the connection.")));
}

/* A header's value: a string, or (a header sent several times) an array of them. */
static void
check_header_values(const char *name, JsonbValue *value)
{
	JsonbIterator *it;
	JsonbValue	elem;
	JsonbIteratorToken tok;

	if (value->type != jbvBinary)
	{
		check_header_value(name, value);
		return;
	}
	if (!JsonContainerIsArray(value->val.binary.data))
		value_not_string(name);
	it = JsonbIteratorInit(value->val.binary.data);
	while ((tok = JsonbIteratorNext(&it, &elem, true)) != WJB_DONE)
		if (tok == WJB_ELEM)
			check_header_value(name, &elem);
}

static int
compare_names(const void *a, const void *b)
{
	return pg_strcasecmp(*(const char *const *) a, *(const char *const *) b);
}

/*
 * headers (argument argno): NULL, or the response headers to save with an
 * outcome, a JSON object of field names to a string or an array of strings
 * (a field sent several times).  Names are case-insensitive, so two keys
 * that differ only in case are refused rather than one of them being lost
 * by whoever sends them.  Returns the datum, or 0 for NULL (or an argument
 * the function does not have: 0.1.0's declarations); checked before
 * anything is written.
 */
Datum
idem_arg_headers(FunctionCallInfo fcinfo, int argno)
{
	Jsonb	   *headers;
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	char	  **names;
	int			nnames = 0;

	if (PG_NARGS() <= argno || PG_ARGISNULL(argno))
		return (Datum) 0;
	headers = PG_GETARG_JSONB_P(argno);
	if (!JB_ROOT_IS_OBJECT(headers))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("headers must be a JSON object"),
				 errdetail("The value given is a JSON %s.",
						   JB_ROOT_IS_SCALAR(headers) ? "scalar" : "array"),
				 errhint("Pass an object of header names and values, such as {\"Location\": \"/orders/7\"}.")));

	names = palloc(sizeof(char *) * (JB_ROOT_COUNT(headers) + 1));
	it = JsonbIteratorInit(&headers->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY)
		{
			char	   *name = pnstrdup(v.val.string.val, v.val.string.len);

			if (v.val.string.len == 0)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("header name must not be empty")));
			for (int i = 0; i < v.val.string.len; i++)
				if (!is_token_char((unsigned char) name[i]))
					ereport(ERROR,
							(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
							 errmsg("invalid header name \"%s\"", name),
							 errdetail("A header name consists of letters, digits and the characters !#$%%&'*+-.^_`|~.")));
			check_header_name_saved(name);
			names[nnames++] = name;
		}
		else if (tok == WJB_VALUE)
			check_header_values(names[nnames - 1], &v);
	}

	qsort(names, nnames, sizeof(char *), compare_names);
	for (int i = 1; i < nnames; i++)
		if (pg_strcasecmp(names[i - 1], names[i]) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("header \"%s\" is given twice", names[i]),
					 errdetail("Header names are case-insensitive: \"%s\" and \"%s\" name the same header.",
							   names[i - 1], names[i]),
					 errhint("Save a header with several values as one array of strings.")));
	return PointerGetDatum(headers);
}
