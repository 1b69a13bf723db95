/*-------------------------------------------------------------------------
 *
 * validation.h
 *		Argument checks shared by the SQL-callable functions (validation.c).
 *
 * The functions are not STRICT: each runs these checks before it reads or
 * writes anything, so a bad argument is an error with its SQLSTATE (22004
 * for a NULL) and nothing is half-written.  They take no lock and read no
 * table: only the call's arguments and the settings.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_VALIDATION_H
#define IDEM_VALIDATION_H

#include "datatype/timestamp.h"
#include "fmgr.h"

/* Largest fingerprint accepted: a SHA-512 digest. */
#define IDEM_MAX_FINGERPRINT_BYTES	64

/* validation.c */
extern text *idem_arg_key(FunctionCallInfo fcinfo, int argno, const char *what);
extern text *idem_arg_scope(FunctionCallInfo fcinfo, int argno);
extern TimestampTz idem_retention_expiry(FunctionCallInfo fcinfo, int argno,
										 TimestampTz now);
extern bytea *idem_arg_fingerprint(FunctionCallInfo fcinfo, int argno);
extern int64 idem_arg_token(FunctionCallInfo fcinfo, int argno);
extern void idem_arg_not_null(FunctionCallInfo fcinfo, int argno, const char *name);
extern Datum idem_arg_headers(FunctionCallInfo fcinfo, int argno);
extern TimestampTz idem_add_interval(TimestampTz base, Interval *span,
									 const char *name);

#endif							/* IDEM_VALIDATION_H */
