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
#include "utils/timestamp.h"

#include "idempotency.h"

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
 * '1 day -25 hours' is as non-positive as '0'.
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
