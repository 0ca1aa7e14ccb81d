//! What writes do, as the API server does it for JSON: create (`generateName`,
//! `AlreadyExists`), replace, merge / strategic / JSON patches, server-side apply with
//! field ownership and conflicts, resourceVersion and uid preconditions, the status
//! subresource, `generation`, finalizers and deletion, and background garbage
//! collection of objects whose owners are all gone.

use serde_json::{Value, json};

use super::error::ApiError;
use super::fields::{self, Claim, Conflict, FieldPath, FieldSet, Operation, Writer};
use super::kinds::ResourceKind;
use super::object::{
    self, SERVER_METADATA, check_shape, has_finalizers, is_deleting, meta_str, owner_uids,
    remove_meta, set_meta, strip_nulls,
};
use super::store::{Key, Store};

/// Where a write to one object goes.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) kind: ResourceKind,
    /// "" for cluster-scoped kinds.
    pub(crate) namespace: String,
    pub(crate) name: String,
    /// The `/status` subresource.
    pub(crate) status: bool,
}

impl Target {
    fn key(&self) -> Key {
        Store::key(&self.kind, &self.namespace, &self.name)
    }

    fn writer(&self, manager: &str, operation: Operation) -> Writer {
        Writer {
            manager: manager.to_string(),
            operation,
            subresource: self.status.then(|| "status".to_string()),
        }
    }

    /// Whether a path of the object is written through this target.
    fn in_scope(&self, path: &FieldPath) -> bool {
        !self.kind.status_subresource
            || (path.first().map(String::as_str) == Some("status")) == self.status
    }
}

/// A PATCH body, by content type.
#[derive(Debug, Clone)]
pub(crate) enum PatchBody {
    /// `application/merge-patch+json` (RFC 7396).
    Merge(Value),
    /// `application/strategic-merge-patch+json`, applied as a merge patch.
    Strategic(Value),
    /// `application/json-patch+json` (RFC 6902).
    Json(json_patch::Patch),
}

/// What a DELETE asks besides the deletion.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DeleteOptions {
    pub(crate) uid: Option<String>,
    pub(crate) resource_version: Option<String>,
    /// `propagationPolicy: Orphan`: dependents lose their owner reference instead of
    /// being collected.
    pub(crate) orphan: bool,
}

impl DeleteOptions {
    /// From a `DeleteOptions` body (`null` when the request had none).
    pub(crate) fn from_body(body: &Value) -> Self {
        let text = |v: &Value| v.as_str().map(str::to_string);
        DeleteOptions {
            uid: text(&body["preconditions"]["uid"]),
            resource_version: text(&body["preconditions"]["resourceVersion"]),
            orphan: body["propagationPolicy"] == "Orphan" || body["orphanDependents"] == true,
        }
    }
}

impl Store {
    /// POST: a new object of `kind` in `namespace`.
    pub(crate) fn create(
        &mut self,
        kind: &ResourceKind,
        namespace: &str,
        body: Value,
        manager: &str,
        now: &str,
    ) -> Result<Value, ApiError> {
        check_shape(&body)?;
        let writer = Writer {
            manager: manager.to_string(),
            operation: Operation::Update,
            subresource: None,
        };
        self.create_object(kind, namespace, None, body, &writer, Claim::Changed, now)
    }

    /// PUT.
    pub(crate) fn replace(
        &mut self,
        t: &Target,
        body: Value,
        manager: &str,
        now: &str,
    ) -> Result<Value, ApiError> {
        check_shape(&body)?;
        let old = self.get(&t.kind, &t.namespace, &t.name)?.clone();
        let writer = t.writer(manager, Operation::Update);
        self.write_existing(t, old, body, &writer, Claim::Changed, now)
    }

    /// PATCH with a merge, strategic merge or JSON patch.
    pub(crate) fn patch(
        &mut self,
        t: &Target,
        patch: PatchBody,
        manager: &str,
        now: &str,
    ) -> Result<Value, ApiError> {
        let old = self.get(&t.kind, &t.namespace, &t.name)?.clone();
        let mut proposed = old.clone();
        match patch {
            PatchBody::Merge(p) => json_patch::merge(&mut proposed, &p),
            PatchBody::Strategic(mut p) => {
                strip_directives(&mut p);
                json_patch::merge(&mut proposed, &p);
            }
            PatchBody::Json(ops) => json_patch::patch(&mut proposed, &ops)
                .map_err(|e| ApiError::invalid(&t.kind, &t.name, &e.to_string()))?,
        }
        check_shape(&proposed)?;
        let writer = t.writer(manager, Operation::Update);
        self.write_existing(t, old, proposed, &writer, Claim::Changed, now)
    }

    /// PATCH with `application/apply-patch+yaml`: server-side apply of `config` by
    /// `manager`; creates the object if it is missing.
    pub(crate) fn apply(
        &mut self,
        t: &Target,
        mut config: Value,
        manager: &str,
        force: bool,
        now: &str,
    ) -> Result<Value, ApiError> {
        check_shape(&config)?;
        if !config["apiVersion"].is_string() || !config["kind"].is_string() {
            return Err(ApiError::bad_request(
                "invalid object type: an applied configuration must set apiVersion and kind",
            ));
        }
        if manager.is_empty() {
            return Err(ApiError::bad_request(
                "PATCH, application/apply-patch+yaml requires fieldManager to be set",
            ));
        }
        check_type(&t.kind, &config)?;
        strip_nulls(&mut config);
        if t.kind.status_subresource
            && !t.status
            && let Some(map) = config.as_object_mut()
        {
            map.remove("status");
        }
        let writer = t.writer(manager, Operation::Apply);
        let applied: FieldSet = fields::leaves(&config)
            .into_iter()
            .filter(|p| t.in_scope(p))
            .collect();
        let Some(old) = self.objects.get(&t.key()).cloned() else {
            if t.status {
                return Err(ApiError::not_found(&t.kind, &t.name));
            }
            let claim = Claim::Apply {
                fields: applied,
                force,
            };
            return self.create_object(
                &t.kind,
                &t.namespace,
                Some(&t.name),
                config,
                &writer,
                claim,
                now,
            );
        };
        // Fields this manager applied before and no longer does are removed, unless
        // another manager owns them too.
        let entries = fields::read(&old);
        let before = entries
            .iter()
            .find(|e| e.writer == writer)
            .map(|e| e.fields.clone())
            .unwrap_or_default();
        let mut proposed = old.clone();
        for path in before.difference(&applied) {
            if !fields::owned_by_other(&entries, &writer, path) {
                fields::remove(&mut proposed, path);
            }
        }
        json_patch::merge(&mut proposed, &config);
        let claim = Claim::Apply {
            fields: applied,
            force,
        };
        self.write_existing(t, old, proposed, &writer, claim, now)
    }

    #[allow(clippy::too_many_arguments)]
    fn create_object(
        &mut self,
        kind: &ResourceKind,
        namespace: &str,
        url_name: Option<&str>,
        mut body: Value,
        writer: &Writer,
        claim: Claim,
        now: &str,
    ) -> Result<Value, ApiError> {
        check_type(kind, &body)?;
        check_namespace(kind, namespace, &body)?;
        strip_nulls(&mut body);
        let (name, generate) = (meta_str(&body, "name"), meta_str(&body, "generateName"));
        let name = match url_name {
            Some(url) if !name.is_empty() && name != url => {
                return Err(name_mismatch(name, url));
            }
            Some(url) => url.to_string(),
            None if !name.is_empty() => name.to_string(),
            None if !generate.is_empty() => {
                let generate = generate.to_string();
                self.generate_name(kind, namespace, &generate)
            }
            None => {
                return Err(ApiError::invalid(
                    kind,
                    "",
                    "metadata.name: Required value: name or generateName is required",
                ));
            }
        };
        check_name(kind, &name)?;
        let key = Store::key(kind, namespace, &name);
        if self.objects.contains_key(&key) {
            return Err(ApiError::already_exists(kind, &name));
        }
        if kind.status_subresource
            && let Some(map) = body.as_object_mut()
        {
            map.remove("status");
        }
        set_type(kind, &mut body);
        for field in SERVER_METADATA {
            remove_meta(&mut body, field);
        }
        set_meta(&mut body, "name", json!(name));
        if kind.namespaced {
            set_meta(&mut body, "namespace", json!(namespace));
        }
        set_meta(&mut body, "uid", json!(self.next_uid()));
        set_meta(&mut body, "creationTimestamp", json!(now));
        set_meta(&mut body, "generation", json!(1));
        let entries = fields::record(
            Vec::new(),
            writer,
            claim,
            &Value::Null,
            &body,
            &kind.api_version(),
            now,
        );
        fields::write(&mut body, &entries);
        Ok(self.store(key, body, None))
    }

    /// The common end of PUT, PATCH and apply on an existing object: preconditions,
    /// the status subresource, server-owned metadata, ownership, `generation`.
    fn write_existing(
        &mut self,
        t: &Target,
        old: Value,
        mut proposed: Value,
        writer: &Writer,
        claim: Claim,
        now: &str,
    ) -> Result<Value, ApiError> {
        let kind = &t.kind;
        let rv = meta_str(&proposed, "resourceVersion");
        if !rv.is_empty() && rv != meta_str(&old, "resourceVersion") {
            return Err(ApiError::modified(kind, &t.name));
        }
        let name = meta_str(&proposed, "name");
        if !name.is_empty() && name != t.name {
            return Err(name_mismatch(name, &t.name));
        }
        check_namespace(kind, &t.namespace, &proposed)?;
        check_type(kind, &proposed)?;
        strip_nulls(&mut proposed);

        let mut new = if !kind.status_subresource {
            proposed
        } else if t.status {
            with_status_of(old.clone(), &proposed)
        } else {
            with_status_of(proposed, &old)
        };
        set_type(kind, &mut new);
        for field in SERVER_METADATA {
            match old["metadata"].get(*field) {
                Some(value) => set_meta(&mut new, field, value.clone()),
                None => remove_meta(&mut new, field),
            }
        }

        let entries = fields::read(&old);
        if let Claim::Apply { force: false, .. } = claim {
            let conflicts = fields::conflicts(&entries, writer, &old, &new);
            if !conflicts.is_empty() {
                return Err(apply_conflict(kind, &t.name, &conflicts));
            }
        }
        let entries = fields::record(entries, writer, claim, &old, &new, &kind.api_version(), now);
        fields::write(&mut new, &entries);
        if object::spec_changed(kind, &old, &new) {
            set_meta(
                &mut new,
                "generation",
                json!(object::generation(&old).saturating_add(1)),
            );
        }
        Ok(self.commit(t.key(), old, new))
    }

    /// Stores an update (nothing if it changes nothing); an update that removes the
    /// last finalizer of an object being deleted removes it.
    fn commit(&mut self, key: Key, old: Value, new: Value) -> Value {
        if new == old {
            return old;
        }
        if is_deleting(&new) && !has_finalizers(&new) {
            self.insert_object(key.clone(), new.clone());
            return self.remove(&key).unwrap_or(new);
        }
        self.store(key, new, Some(old))
    }

    /// DELETE: the object is removed, or (with finalizers) marked with a
    /// `deletionTimestamp`; then objects left without any owner are collected. Returns
    /// the object and whether it is gone.
    pub(crate) fn delete(
        &mut self,
        t: &Target,
        opts: &DeleteOptions,
        now: &str,
    ) -> Result<(Value, bool), ApiError> {
        let old = self.get(&t.kind, &t.namespace, &t.name)?.clone();
        let precondition = |wanted: &Option<String>, field: &str| {
            wanted.as_ref().is_none_or(|w| w == meta_str(&old, field))
        };
        if !precondition(&opts.uid, "uid")
            || !precondition(&opts.resource_version, "resourceVersion")
        {
            return Err(ApiError::modified(&t.kind, &t.name));
        }
        if opts.orphan {
            self.orphan_dependents(meta_str(&old, "uid"));
        }
        let deleted = self.delete_object(t.key(), old, now);
        self.collect_garbage(now);
        Ok(deleted)
    }

    /// DELETE of a collection: each object of `matching` as [`Store::delete`].
    pub(crate) fn delete_all(
        &mut self,
        matching: Vec<Key>,
        opts: &DeleteOptions,
        now: &str,
    ) -> Vec<Value> {
        let mut deleted = Vec::new();
        for key in matching {
            let Some(old) = self.objects.get(&key).cloned() else {
                continue;
            };
            if opts.orphan {
                self.orphan_dependents(meta_str(&old, "uid"));
            }
            deleted.push(self.delete_object(key, old, now).0);
        }
        self.collect_garbage(now);
        deleted
    }

    fn delete_object(&mut self, key: Key, old: Value, now: &str) -> (Value, bool) {
        if !has_finalizers(&old) {
            let gone = self.remove(&key).unwrap_or(old);
            return (gone, true);
        }
        if is_deleting(&old) {
            return (old, false);
        }
        let mut new = old.clone();
        set_meta(&mut new, "deletionTimestamp", json!(now));
        set_meta(&mut new, "deletionGracePeriodSeconds", json!(0));
        if object::generation(&old) > 0 {
            set_meta(
                &mut new,
                "generation",
                json!(object::generation(&old).saturating_add(1)),
            );
        }
        (self.store(key, new, Some(old)), false)
    }

    /// Background garbage collection: while objects were removed, deletes the objects
    /// whose owner references all point to objects that no longer exist. Only the
    /// objects with owner references are looked at (`owned`), their owners looked up by
    /// uid (`uid_index`): a removal costs the owned objects, not every object.
    pub(crate) fn collect_garbage(&mut self, now: &str) {
        while self.removed {
            self.removed = false;
            let orphans: Vec<(Key, Value)> = self
                .owned
                .iter()
                .filter_map(|k| self.objects.get(k).map(|o| (k, o)))
                .filter(|(_, o)| {
                    let owners = owner_uids(o);
                    !owners.is_empty()
                        && !is_deleting(o)
                        && owners.iter().all(|u| !self.uid_exists(u))
                })
                .map(|(k, o)| (k.clone(), o.clone()))
                .collect();
            for (key, old) in orphans {
                self.delete_object(key, old, now);
            }
        }
    }

    /// Removes the owner reference to `uid` from every object.
    fn orphan_dependents(&mut self, uid: &str) {
        let dependents: Vec<(Key, Value)> = self
            .objects
            .iter()
            .filter(|(_, o)| owner_uids(o).contains(&uid))
            .map(|(k, o)| (k.clone(), o.clone()))
            .collect();
        for (key, old) in dependents {
            let mut new = old.clone();
            let refs: Vec<Value> = old["metadata"]["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|r| r["uid"] != uid)
                .cloned()
                .collect();
            if refs.is_empty() {
                remove_meta(&mut new, "ownerReferences");
            } else {
                set_meta(&mut new, "ownerReferences", Value::Array(refs));
            }
            self.store(key, new, Some(old));
        }
    }

    /// Stores `object` as it is (test setup): its kind from `apiVersion` and `kind`,
    /// the `default` namespace if a namespaced object has none; keeps its status and
    /// managed fields, fills in uid, creationTimestamp and generation if missing.
    pub(crate) fn put(&mut self, mut object: Value, now: &str) -> Result<Value, ApiError> {
        check_shape(&object)?;
        let (api_version, kind) = (object["apiVersion"].as_str(), object["kind"].as_str());
        let kind = self
            .kinds
            .by_type(api_version.unwrap_or_default(), kind.unwrap_or_default())
            .cloned()
            .ok_or_else(|| {
                ApiError::new(
                    404,
                    format!("no kind {kind:?} is registered for version {api_version:?}"),
                )
            })?;
        let name = meta_str(&object, "name").to_string();
        check_name(&kind, &name)?;
        let namespace = match meta_str(&object, "namespace") {
            _ if !kind.namespaced => "",
            "" => "default",
            ns => ns,
        }
        .to_string();
        strip_nulls(&mut object);
        if kind.namespaced {
            set_meta(&mut object, "namespace", json!(namespace));
        } else {
            remove_meta(&mut object, "namespace");
        }
        let key = Store::key(&kind, &namespace, &name);
        let old = self.objects.get(&key).cloned();
        let stored = |field: &str| old.as_ref().map(|o| o["metadata"][field].clone());
        if meta_str(&object, "uid").is_empty() {
            let uid = match stored("uid") {
                Some(Value::String(uid)) => uid,
                _ => self.next_uid(),
            };
            set_meta(&mut object, "uid", json!(uid));
        }
        if meta_str(&object, "creationTimestamp").is_empty() {
            let created = stored("creationTimestamp").unwrap_or_else(|| json!(now));
            set_meta(&mut object, "creationTimestamp", created);
        }
        if object["metadata"]["generation"].is_null() {
            let generation = match &old {
                Some(old) if object::spec_changed(&kind, old, &object) => {
                    object::generation(old).saturating_add(1)
                }
                Some(old) => object::generation(old),
                None => 1,
            };
            set_meta(&mut object, "generation", json!(generation));
        }
        Ok(self.store(key, object, old))
    }

    /// `prefix` and five characters, unused in `namespace`.
    fn generate_name(&mut self, kind: &ResourceKind, namespace: &str, prefix: &str) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        loop {
            // A multiplier coprime with 27^5 spreads consecutive serials apart.
            let mut n = self.next_serial().wrapping_mul(2_654_435_761) % 14_348_907;
            let suffix: String = (0..5)
                .map(|_| {
                    let c = ALPHABET.get((n % 27) as usize).copied().unwrap_or(b'x');
                    n /= 27;
                    char::from(c)
                })
                .collect();
            let name = format!("{prefix}{suffix}");
            if !self
                .objects
                .contains_key(&Store::key(kind, namespace, &name))
            {
                return name;
            }
        }
    }
}

/// `base` with the `status` of `from` (none if `from` has none).
fn with_status_of(mut base: Value, from: &Value) -> Value {
    if let Some(map) = base.as_object_mut() {
        match from.get("status") {
            Some(status) => map.insert("status".into(), status.clone()),
            None => map.remove("status"),
        };
    }
    base
}

fn set_type(kind: &ResourceKind, object: &mut Value) {
    if let Some(map) = object.as_object_mut() {
        map.insert("apiVersion".into(), json!(kind.api_version()));
        map.insert("kind".into(), json!(kind.kind));
    }
}

/// `apiVersion` and `kind`, when the body sets them, must be the URL's.
fn check_type(kind: &ResourceKind, body: &Value) -> Result<(), ApiError> {
    let api_version = kind.api_version();
    let mismatch = |field: &str, expected: &str| {
        body[field]
            .as_str()
            .filter(|given| *given != expected)
            .map(|given| {
                ApiError::bad_request(format!(
                    "the {field} in the data ({given}) does not match the expected {field} ({expected})"
                ))
            })
    };
    match mismatch("apiVersion", &api_version).or_else(|| mismatch("kind", &kind.kind)) {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

fn check_namespace(kind: &ResourceKind, namespace: &str, body: &Value) -> Result<(), ApiError> {
    let given = meta_str(body, "namespace");
    if kind.namespaced && !given.is_empty() && given != namespace {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    Ok(())
}

/// Names are DNS-1123 subdomains.
fn check_name(kind: &ResourceKind, name: &str) -> Result<(), ApiError> {
    let label_ok = |label: &str| {
        !label.is_empty()
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if name.len() <= 253 && name.split('.').all(label_ok) {
        return Ok(());
    }
    Err(ApiError::invalid(
        kind,
        name,
        &format!(
            "metadata.name: Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist \
             of lower case alphanumeric characters, '-' or '.', and must start and end with an \
             alphanumeric character"
        ),
    ))
}

fn name_mismatch(body: &str, url: &str) -> ApiError {
    ApiError::bad_request(format!(
        "the name of the object ({body}) does not match the name on the URL ({url})"
    ))
}

/// Strategic merge patch directives (`$patch`, `$retainKeys`, `$setElementOrder/…`,
/// `$deleteFromPrimitiveList/…`) are dropped: the patch is applied as a merge patch.
fn strip_directives(patch: &mut Value) {
    if let Some(map) = patch.as_object_mut() {
        map.retain(|k, _| !k.starts_with('$'));
        map.values_mut().for_each(strip_directives);
    }
}

/// `409 Conflict` of an apply, naming each field and its manager.
fn apply_conflict(kind: &ResourceKind, name: &str, conflicts: &[Conflict]) -> ApiError {
    let describe =
        |c: &Conflict| format!("conflict with \"{}\" using {}", c.manager, c.api_version);
    let lines: Vec<String> = conflicts
        .iter()
        .map(|c| format!("{}: {}", describe(c), fields::display(&c.path)))
        .collect();
    let message = match lines.as_slice() {
        [one] => format!("Apply failed with 1 conflict: {one}"),
        many => format!(
            "Apply failed with {} conflicts: {}",
            many.len(),
            many.join("\n")
        ),
    };
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|c| {
            json!({"reason": "FieldManagerConflict", "message": describe(c),
                   "field": fields::display(&c.path)})
        })
        .collect();
    let mut error = ApiError::new(409, message).with_details(kind, name);
    if let Some(details) = error.details.as_object_mut() {
        details.insert("causes".into(), Value::Array(causes));
    }
    error
}
