/*-------------------------------------------------------------------------
 *
 * version.h
 *		The check that the installed SQL objects are a version this library
 *		serves (version.c).
 *
 * Called by extension_objects.c when it loads the objects, and again after
 * any function of the database was created, replaced or altered; the
 * answer is kept per backend until then.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_VERSION_H
#define IDEM_VERSION_H

/* version.c: false when it could not check (in an extension script) */
extern bool idem_version_check(Oid fn_oid);

#endif							/* IDEM_VERSION_H */
