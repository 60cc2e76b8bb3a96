use std::collections::BTreeMap;

use prost::Message;
use prost_types::value::Kind;
use serde::Deserialize;

use super::*;

#[derive(Deserialize)]
struct Fixture {
    tag: String,
    input: Option<BTreeMap<String, Value>>,
    context: Option<BTreeMap<String, Value>>,
    observed: FixtureState,
    desired: FixtureState,
}

#[derive(Deserialize)]
struct FixtureState {
    composite: Option<FixtureResource>,
    #[serde(default)]
    resources: BTreeMap<String, FixtureResource>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FixtureResource {
    resource: BTreeMap<String, Value>,
    #[serde(default)]
    connection_details: BTreeMap<String, String>,
    ready: Option<String>,
}

fn v1_resource(r: &FixtureResource) -> v1::Resource {
    v1::Resource {
        resource: Some(structpb::from_yaml(&r.resource).unwrap()),
        connection_details: r
            .connection_details
            .iter()
            .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
            .collect(),
        ready: r
            .ready
            .as_deref()
            .map_or(0, |s| v1::Ready::from_str_name(s).unwrap().into()),
    }
}

fn v1_state(s: &FixtureState) -> v1::State {
    v1::State {
        composite: s.composite.as_ref().map(v1_resource),
        resources: s
            .resources
            .iter()
            .map(|(k, r)| (k.clone(), v1_resource(r)))
            .collect(),
    }
}

/// The realistic request of `testdata/run_function_request.yaml`.
fn request() -> v1::RunFunctionRequest {
    let f: Fixture =
        serde_norway::from_str(include_str!("../../testdata/run_function_request.yaml")).unwrap();
    v1::RunFunctionRequest {
        meta: Some(v1::RequestMeta {
            tag: f.tag,
            capabilities: vec![
                v1::Capability::Capabilities.into(),
                v1::Capability::Conditions.into(),
            ],
        }),
        observed: Some(v1_state(&f.observed)),
        desired: Some(v1_state(&f.desired)),
        input: f.input.as_ref().map(|m| structpb::from_yaml(m).unwrap()),
        context: f.context.as_ref().map(|m| structpb::from_yaml(m).unwrap()),
        ..Default::default()
    }
}

fn yaml(doc: &str) -> Value {
    serde_norway::from_str(doc).unwrap()
}

#[test]
fn request_becomes_the_functionio_v1_13_sent() {
    let io = functionio_from_request(&request());
    assert_eq!(
        (io.api_version.as_deref(), io.kind.as_deref()),
        (None, None)
    );
    let config = io.config.as_ref().unwrap();
    assert_eq!(config["kind"], yaml("DatabaseConfig"));
    assert_eq!(config["spec"]["storageGB"], yaml("20"));
    assert_eq!(config["spec"]["engineVersion"], yaml("'16.3'"));

    let xr = &io.observed.composite;
    assert_eq!(xr.resource["spec"]["parameters"]["replicas"], yaml("2"));
    assert_eq!(
        xr.resource["status"]["conditions"][0]["status"],
        yaml("'False'")
    );
    let names: Vec<&str> = xr
        .connection_details
        .iter()
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(names, ["endpoint", "port"]);
    assert_eq!(xr.connection_details[1].value, "5432");

    let names: Vec<&str> = io
        .observed
        .resources
        .iter()
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(names, ["instance", "subnet-group"]);
    let instance = &io.observed.resources[0];
    assert_eq!(
        instance.resource["status"]["atProvider"]["port"],
        yaml("5432")
    );
    assert!(instance.connection_details.contains(&ConnectionDetail {
        name: "password".into(),
        value: "c0rrect-h0rse".into()
    }));

    // The desired state is the pipeline's partial state, without readiness.
    assert_eq!(
        io.desired.composite.resource["status"]["address"],
        yaml("orders-db.cluster-abc.eu-west-1.rds.amazonaws.com")
    );
    assert!(!io.desired.composite.resource.contains_key("spec"));
    let names: Vec<&str> = io
        .desired
        .resources
        .iter()
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(names, ["instance", "subnet-group"]);
    assert!(
        io.desired
            .resources
            .iter()
            .all(|r| r.connection_details.is_empty() && r.readiness_checks.is_empty())
    );
    assert!(io.results.is_empty());

    // What the function reads is a FunctionIO by fnrun's own check.
    let text = functionio_yaml_from_request(&request()).unwrap();
    assert_eq!(functionio::validate(&text).unwrap(), io);
}

#[test]
fn a_function_that_changes_nothing_gives_back_the_desired_state() {
    let request = request();
    let response = response_from_functionio(&request, functionio_from_request(&request)).unwrap();
    assert_eq!(response.desired, request.desired);
    assert_eq!(response.context, request.context);
    assert_eq!(response.meta.as_ref().unwrap().tag, "4f3c2a9e");
    assert_eq!(response.meta.as_ref().unwrap().ttl, None);
    assert!(response.results.is_empty());
    assert!(response.requirements.is_none() && response.conditions.is_empty());
    assert!(response.output.is_none());

    // Through the bytes the function actually reads and writes.
    let stdin = functionio_yaml_from_request(&request).unwrap();
    assert_eq!(
        response_from_functionio_yaml(&request, &stdin).unwrap(),
        response
    );

    // And the same over v1beta1's wire format.
    let beta: crate::v1beta1::RunFunctionRequest = crate::transcode(&request).unwrap();
    let as_v1: v1::RunFunctionRequest = crate::transcode(&beta).unwrap();
    assert_eq!(
        response_from_functionio(&as_v1, functionio_from_request(&as_v1))
            .unwrap()
            .encode_to_vec(),
        response.encode_to_vec()
    );
}

/// What an xfn-era function writes: it keeps what it got, adds a parameter
/// group with derived connection details and readiness checks, sets
/// composite connection details and status, and reports results.
const OUTPUT: &str = r#"
apiVersion: apiextensions.crossplane.io/v1alpha1
kind: FunctionIO
config: {ignored: true}
observed:
  composite: {resource: {changed: "ignored"}}
desired:
  composite:
    resource:
      apiVersion: example.org/v1alpha1
      kind: XPostgres
      status:
        address: orders-db.cluster-abc.eu-west-1.rds.amazonaws.com
        parameterGroup: orders-db-pg
    connectionDetails:
    - {name: port, value: "5432"}
    - {name: username, value: overridden-below}
  resources:
  - name: instance
    resource:
      apiVersion: rds.aws.upbound.io/v1beta1
      kind: Instance
      spec:
        forProvider: {engine: postgres, engineVersion: "16.3", instanceClass: db.t3.micro, allocatedStorage: 20, region: eu-west-1, parameterGroupName: orders-db-pg}
    connectionDetails:
    - {type: FromConnectionSecretKey, fromConnectionSecretKey: username}
    - {type: FromConnectionSecretKey, name: pass, fromConnectionSecretKey: password}
    - {type: FromFieldPath, name: host, fromFieldPath: status.atProvider.address}
    - {type: FromFieldPath, name: portNumber, fromFieldPath: status.atProvider.port}
    - {type: FromValue, name: engine, value: postgres}
    readinessChecks:
    - {type: MatchCondition, matchCondition: {type: Ready, status: "True"}}
  - name: subnet-group
    resource:
      apiVersion: rds.aws.upbound.io/v1beta1
      kind: SubnetGroup
      spec:
        forProvider: {region: eu-west-1, subnetIds: [subnet-0a1, subnet-0b2]}
  - name: parameter-group
    resource:
      apiVersion: rds.aws.upbound.io/v1beta1
      kind: ParameterGroup
      spec:
        forProvider: {family: postgres16, region: eu-west-1, parameter: [{name: max_connections, value: "200"}]}
    connectionDetails:
    - {type: FromFieldPath, name: pgArn, fromFieldPath: status.atProvider.arn}
    readinessChecks:
    - {type: NonEmpty, fieldPath: status.atProvider.arn}
results:
- {severity: Normal, message: "composed 3 resources"}
- {severity: Warning, message: "engineVersion 16.3 is deprecated"}
- {severity: Fatal, message: "quota exceeded"}
"#;

#[test]
fn function_output_becomes_the_response() {
    let request = request();
    let response = response_from_functionio_yaml(&request, OUTPUT.as_bytes()).unwrap();
    let desired = response.desired.unwrap();

    let xr = desired.composite.unwrap();
    let status = structpb::to_yaml(xr.resource.as_ref().unwrap());
    assert_eq!(status["status"]["parameterGroup"], yaml("orders-db-pg"));
    // The request's readiness of the XR is carried.
    assert_eq!(xr.ready, i32::from(v1::Ready::False));
    let details: BTreeMap<&str, &str> = xr
        .connection_details
        .iter()
        .map(|(k, v)| (k.as_str(), std::str::from_utf8(v).unwrap()))
        .collect();
    assert_eq!(
        details,
        BTreeMap::from([
            ("engine", "postgres"),
            ("host", "orders-db.cluster-abc.eu-west-1.rds.amazonaws.com"),
            ("pass", "c0rrect-h0rse"),
            ("port", "5432"),
            ("portNumber", "5432"),
            // Derived details override explicit ones, as in v1.13.
            ("username", "admin"),
        ])
    );

    let names: Vec<&str> = desired.resources.keys().map(String::as_str).collect();
    assert_eq!(names, ["instance", "parameter-group", "subnet-group"]);
    let instance = &desired.resources["instance"];
    assert_eq!(instance.ready, i32::from(v1::Ready::True));
    let body = structpb::to_yaml(instance.resource.as_ref().unwrap());
    assert_eq!(
        body["spec"]["forProvider"]["parameterGroupName"],
        yaml("orders-db-pg")
    );
    assert_eq!(body["spec"]["forProvider"]["allocatedStorage"], yaml("20"));
    // A new resource has no readiness (its checks are lost) and no details.
    let pg = &desired.resources["parameter-group"];
    assert_eq!(pg.ready, i32::from(v1::Ready::Unspecified));
    assert!(pg.connection_details.is_empty());
    // Connection details of a desired resource are carried from the request.
    assert_eq!(
        desired.resources["subnet-group"].connection_details["ignored-by-crossplane"],
        b"x"
    );

    let results: Vec<(v1::Severity, &str)> = response
        .results
        .iter()
        .map(|r| (r.severity(), r.message.as_str()))
        .collect();
    assert_eq!(
        results,
        [
            (v1::Severity::Normal, "composed 3 resources"),
            (v1::Severity::Warning, "engineVersion 16.3 is deprecated"),
            (v1::Severity::Fatal, "quota exceeded"),
        ]
    );
    assert!(
        response
            .results
            .iter()
            .all(|r| r.reason.is_none() && r.target.is_none())
    );
    assert_eq!(response.context, request.context);
}

#[test]
fn an_empty_request_gives_an_empty_functionio_and_back() {
    let request = v1::RunFunctionRequest::default();
    let io = functionio_from_request(&request);
    assert_eq!(io, FunctionIo::default());
    let text = String::from_utf8(functionio_yaml_from_request(&request).unwrap()).unwrap();
    assert_eq!(
        text,
        "observed:\n  composite:\n    resource: {}\ndesired:\n  composite:\n    resource: {}\n"
    );
    let response = response_from_functionio(&request, io).unwrap();
    assert_eq!(
        response,
        v1::RunFunctionResponse {
            meta: Some(v1::ResponseMeta::default()),
            desired: Some(v1::State::default()),
            ..Default::default()
        }
    );
}

#[test]
fn binary_connection_details_become_replacement_characters() {
    let request = v1::RunFunctionRequest {
        observed: Some(v1::State {
            composite: Some(v1::Resource {
                connection_details: [("key".to_owned(), vec![b'a', 0xff, b'b'])].into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let io = functionio_from_request(&request);
    assert_eq!(
        io.observed.composite.connection_details[0].value,
        "a\u{fffd}b"
    );
}

#[test]
fn refuses_output_it_cannot_map() {
    let request = request();
    let cases = [
        (
            "- not a FunctionIO",
            "function output is not a FunctionIO: document is not a YAML mapping",
        ),
        (
            "desired: {resources: [{name: bucket, resource: {spec: {ratio: .nan}}}]}",
            "at desired.resources.bucket.resource.spec.ratio: number is not finite",
        ),
        (
            "desired: {composite: {resource: {status: {x: !vault secret/db}}}}",
            "function output is not a FunctionIO: at desired.composite.resource.status.x: the value has the YAML tag \"!vault\"",
        ),
        (
            "desired: {resources: [{name: 'my bucket', resource: {}, connectionDetails: [{type: FromValue, value: v}]}]}",
            "desired resource \"my bucket\": connectionDetails[0]: connection detail has no name",
        ),
        (
            "desired: {resources: [{name: b, resource: {}, connectionDetails: [{type: FromFieldPath, name: a}]}]}",
            "connection detail of type FromFieldPath has no fromFieldPath",
        ),
    ];
    for (doc, want) in cases {
        let err = response_from_functionio_yaml(&request, doc.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(want),
            "{doc:?}: {err:?} does not contain {want:?}"
        );
    }
}

#[test]
fn a_repeated_resource_name_keeps_its_last_entry() {
    let output = "desired: {resources: [{name: a, resource: {v: 1}}, {name: a, resource: {v: 2}}]}";
    let response = response_from_functionio_yaml(&request(), output.as_bytes()).unwrap();
    let resources = response.desired.unwrap().resources;
    assert_eq!(resources.len(), 1);
    assert_eq!(
        resources["a"].resource.as_ref().unwrap().fields["v"].kind,
        Some(Kind::NumberValue(2.0))
    );
}

/// A request whose Struct at `place` holds `{data: {n: 1.5, bad: value}}`.
fn request_with(place: &str, value: f64) -> v1::RunFunctionRequest {
    let body = prost_types::Struct {
        fields: [(
            "data".to_owned(),
            prost_types::Value {
                kind: Some(Kind::StructValue(prost_types::Struct {
                    fields: [
                        (
                            "n".to_owned(),
                            prost_types::Value {
                                kind: Some(Kind::NumberValue(1.5)),
                            },
                        ),
                        (
                            "bad".to_owned(),
                            prost_types::Value {
                                kind: Some(Kind::NumberValue(value)),
                            },
                        ),
                    ]
                    .into(),
                })),
            },
        )]
        .into(),
    };
    let resource = v1::Resource {
        resource: Some(body.clone()),
        ..Default::default()
    };
    let mut request = request();
    match place {
        "input" => request.input = Some(body),
        "observed composite" => request.observed.as_mut().unwrap().composite = Some(resource),
        "desired resource" => {
            request
                .desired
                .as_mut()
                .unwrap()
                .resources
                .insert("my cm".to_owned(), resource);
        }
        other => panic!("{other}"),
    }
    request
}

#[test]
fn refuses_a_request_json_cannot_hold() {
    // The second fuzz finding: a NaN in a desired resource (a binary Struct
    // carries one) was written as `.nan`, and the function's unchanged
    // output was then refused. Now the request is refused, naming where.
    for (place, value, want) in [
        (
            "desired resource",
            f64::NAN,
            "at desired.resources[\"my cm\"].resource.data.bad: number is not finite",
        ),
        (
            "observed composite",
            f64::INFINITY,
            "at observed.composite.resource.data.bad: number is not finite",
        ),
        ("input", f64::NEG_INFINITY, "at input.data.bad: number"),
    ] {
        let request = request_with(place, value);
        let err = functionio_yaml_from_request(&request).unwrap_err();
        assert!(matches!(err, Error::Request(_)), "{err:?}");
        let err = err.to_string();
        assert!(
            err.starts_with("the request has a value FunctionIO cannot carry")
                && err.contains(want),
            "{place}: {err:?} does not contain {want:?}"
        );
    }
    // Finite numbers pass, and the unchanged FunctionIO maps back.
    let request = request_with("desired resource", 1e300);
    let stdin = functionio_yaml_from_request(&request).unwrap();
    response_from_functionio_yaml(&request, &stdin).unwrap();
}
