// Queue jobs function app: storage (queues + containers), Flex Consumption function app (Python 3.11),
// Application Insights on a Log Analytics workspace, and a user-assigned managed identity that is the
// only way the app reaches storage and telemetry. No account keys anywhere: the storage account
// refuses Shared Key, Application Insights refuses local (ikey-only) auth.
//
// infra/main.json is the same template in ARM JSON (kept in step by tests/deploy/test_infra.py).
// Deploy with deploy/deploy.sh (see docs/deploy.md).

targetScope = 'resourceGroup'

@description('Short lower-case prefix for resource names (letters and digits, 2-9 characters).')
@minLength(2)
@maxLength(9)
param namePrefix string

@description('Azure region. Must offer the Flex Consumption plan.')
param location string = resourceGroup().location

@description('Tags applied to every resource.')
param tags object = {}

@description('Storage redundancy.')
@allowed([
  'Standard_LRS'
  'Standard_ZRS'
  'Standard_GRS'
  'Standard_RAGRS'
])
param storageSku string = 'Standard_LRS'

@description('Name of the job queue; the host moves poisoned messages to <name>-poison.')
param jobsQueueName string = 'jobs'

@description('More job queues in the app (JOBS_QUEUES: jobsQueueName first, then these), each with its <name>-poison and <name>-parked queue; the app identity gets each. A queue in another storage account is not listed here: its owner creates it (QUEUE_<NAME>_CONNECTION, extraAppSettings).')
param extraJobsQueueNames array = []

@description('Days the ledger record of a finished job (tag state=done) is kept after its last write (LEDGER_RETENTION_DAYS; more than JOB_TTL_SECONDS + 1 day).')
@minValue(1)
param ledgerRetentionDays int = 30

@description('Days a result document is kept (RESULTS_RETENTION_DAYS; at most the ledger retention).')
@minValue(1)
param resultsRetentionDays int = 30

@description('Days a claim-checked payload is kept (PAYLOADS_RETENTION_DAYS; more than JOB_TTL_SECONDS + 1 day).')
@minValue(1)
param payloadsRetentionDays int = 30

@description('Days a poison archive entry is kept (ARCHIVE_RETENTION_DAYS; reasons 7 days longer; edits/ never).')
@minValue(1)
param archiveRetentionDays int = 90

@description('Transient failures retried by the app before a job is poisoned (MAX_ATTEMPTS).')
@minValue(1)
param maxAttempts int = 5

@description('Destinations the http kind may call although its outbound guard refuses them: loopback, private, link-local, the storage of the app, plain http:// (HTTP_ALLOWED_HOSTS, comma-separated host or host:port; a host without a port allows the default port of its scheme only; empty: none). Secrets are not covered: each HTTP_SECRET_<NAME> needs its own HTTP_SECRET_<NAME>_HOSTS in extraAppSettings, or the app refuses to start.')
param httpAllowedHosts string = ''

@description('Connect timeout of the http kind in seconds (HTTP_CONNECT_TIMEOUT_SECONDS).')
@minValue(1)
param httpConnectTimeoutSeconds int = 5

@description('The http kind follows 3xx answers, each target checked by the outbound guard like the first (HTTP_FOLLOW_REDIRECTS).')
param httpFollowRedirects bool = false

@description('An http job answer body larger than this goes in a blob beside the result (HTTP_INLINE_BODY_BYTES).')
@minValue(0)
param httpInlineBodyBytes int = 65536

@description('The most of an http job answer body read and kept; the rest is cut (HTTP_MAX_BODY_BYTES).')
@minValue(1024)
param httpMaxBodyBytes int = 16777216

@description('Runs of an http job that fails transiently before it is poisoned (HTTP_MAX_ATTEMPTS; 0: maxAttempts).')
@minValue(0)
param httpMaxAttempts int = 0

@description('Backoff base of the http kind in seconds: base x 2^(attempt-1), capped, full jitter (HTTP_RETRY_BASE_SECONDS).')
@minValue(0)
param httpRetryBaseSeconds int = 2

@description('Backoff cap of the http kind in seconds, also the longest Retry-After honoured (HTTP_RETRY_MAX_SECONDS).')
@minValue(0)
param httpRetryMaxSeconds int = 300

@description('Retry delays of the http kind are jittered (HTTP_RETRY_JITTER).')
param httpRetryJitter bool = true

@description('Flex Consumption: memory of each instance in MB.')
@allowed([
  512
  2048
  4096
])
param instanceMemoryMB int = 2048

@description('Flex Consumption: upper bound on instances the app scales out to.')
@minValue(40)
@maxValue(1000)
param maximumInstanceCount int = 100

@description('Log Analytics retention in days.')
@minValue(30)
@maxValue(730)
param logRetentionDays int = 30

@description('Log Analytics daily ingestion cap in GB (-1 = no cap). Bounds the cost of a runaway log loop.')
param logDailyQuotaGb int = 1

@description('Spark backend the app offloads large jobs to (SPARK_BACKEND).')
@allowed([
  'none'
  'standalone'
  'livy'
  'databricks'
])
param sparkBackend string = 'none'

@description('Spark submission API base URL (SPARK_URL): standalone REST, Livy endpoint (Synapse/HDInsight), or the Databricks workspace URL.')
param sparkUrl string = ''

@description('How the app authenticates to Livy (SPARK_LIVY_AUTH): entra = token of the managed identity (Synapse), basic = cluster login (HDInsight).')
@allowed([
  'entra'
  'basic'
])
param sparkLivyAuth string = 'entra'

@description('Where the cluster finds aggregate_job.py (SPARK_JOB_FILE). Empty: the spark-jobs container of this account for livy, the shared workspace folder for databricks.')
param sparkJobFile string = ''

@description('Inputs larger than this many bytes go to Spark when a job says engine: auto (SPARK_OFFLOAD_THRESHOLD_BYTES).')
@minValue(0)
param sparkOffloadThresholdBytes int = 268435456

@description('Databricks cluster id the job runs on (SPARK_DATABRICKS_CLUSTER_ID); empty = a new job cluster.')
param sparkDatabricksClusterId string = ''

@description('Optional Key Vault secret URI of a Databricks PAT (only when Entra auth cannot be used). Becomes a Key Vault reference in SPARK_DATABRICKS_TOKEN, resolved with the managed identity.')
param sparkDatabricksTokenSecretUri string = ''

@description('Livy basic auth user (SPARK_LIVY_USER; HDInsight cluster login) when sparkLivyAuth is basic.')
param sparkLivyUser string = ''

@description('Key Vault secret URI of the Livy basic auth password when sparkLivyAuth is basic. Becomes a Key Vault reference in SPARK_LIVY_PASSWORD.')
param sparkLivyPasswordSecretUri string = ''

@description('pyFiles the job needs (SPARK_PY_FILES, the zip built by python -m spark_jobs.package). Empty: next to the default job file for livy and databricks.')
param sparkPyFiles string = ''

@description('Further app settings as name-value pairs (e.g. SPARK_READ_TIMEOUT_SECONDS, SPARK_DATABRICKS_NEW_CLUSTER). The settings this template sets itself take precedence. Settings changed outside this template are replaced on the next deployment, so put them here.')
param extraAppSettings object = {}

@description('Optional object id of the Spark service identity (Synapse workspace / HDInsight / Databricks access connector) that reads the job file and inputs and writes results: gets Storage Blob Data Reader on the spark-jobs and inputs containers and Storage Blob Data Contributor on the results container.')
param sparkPrincipalId string = ''

@description('Optional object id of whoever runs deploy/deploy_spark_job.sh: gets Storage Blob Data Contributor on the spark-jobs container to upload the job file with --auth-mode login.')
param deployerPrincipalId string = ''

@description('Principal type of deployerPrincipalId.')
@allowed([
  'User'
  'ServicePrincipal'
  'Group'
])
param deployerPrincipalType string = 'User'

@description('Also grant Storage Account Contributor (control plane) to the app identity. Not needed with identity-based AzureWebJobsStorage and key access disabled; off by default (least privilege).')
param grantStorageAccountContributor bool = false

// -- console (issue 12) --
@description('Client id of the Entra ID app registration that signs operators in to the console (/api/console) through App Service Authentication. Empty: no authentication is configured and the console refuses every request in Azure.')
param consoleClientId string = ''

@description('App roles (the roles claim) allowed to use the console, comma-separated (CONSOLE_ALLOWED_ROLES).')
param consoleAllowedRoles string = 'Console.Operator'

@description('Group object ids (the groups claim) allowed to use the console, comma-separated (CONSOLE_ALLOWED_GROUPS).')
param consoleAllowedGroups string = ''

@description('Key of the console CSRF tokens (CONSOLE_CSRF_SECRET, at least 32 characters; required in Azure). Default: a new random value on each deployment, which makes open console pages ask for a reload once. Pass a fixed value, or a Key Vault reference (@Microsoft.KeyVault(SecretUri=...)), to keep it.')
@secure()
param consoleCsrfSecret string = format('{0}{1}', newGuid(), newGuid())

@description('Origins (https://host) operators reach the console at when a proxy in front (Front Door, Application Gateway) sends the app another Host header, comma-separated (CONSOLE_PUBLIC_ORIGINS). Empty: the Host header of the request.')
param consolePublicOrigins string = ''
// -- end console --

// -- alerts (issue 36; runbook: docs/operations.md, Alerts) --
@description('Resource id of an action group the alert rules notify (e-mail, SMS, webhook, ...). Empty: the rules fire in the portal only.')
param actionGroupId string = ''

@description('The oldest-message alert fires when the first visible message of the jobs queue is older than this many minutes.')
@minValue(1)
param oldestMessageAlertMinutes int = 15

@description('The failure-rate alert fires when more than this percentage of the delivery decisions of the last hour (at least 10) were poisoned or failed.')
@minValue(1)
@maxValue(100)
param failureRateAlertPercent int = 10

var suffix = uniqueString(resourceGroup().id, namePrefix)
var storageAccountName = toLower(take('st${namePrefix}${suffix}', 24))
var functionAppName = '${namePrefix}-func-${suffix}'
var planName = '${namePrefix}-plan-${suffix}'
var identityName = '${namePrefix}-id-${suffix}'
var appInsightsName = '${namePrefix}-appi-${suffix}'
var workspaceName = '${namePrefix}-log-${suffix}'
var deploymentContainerName = 'app-package'
var sparkJobsContainerName = 'spark-jobs'
var inputContainerName = 'inputs'
var sparkJobBlobName = 'aggregate_job.py'
var sparkEngineZipName = 'aggregate_engine.zip'
var databricksJobFolder = '/Workspace/Shared/queue-jobs'
// <queue>-ops: the console's bulk operations, run step by step by run_op_step (its queue trigger;
// the host never creates a queue it listens to).
var queueNames = [
  jobsQueueName
  '${jobsQueueName}-poison'
  '${jobsQueueName}-parked'
  '${jobsQueueName}-ops'
]
// The console's Table indexes (shared/indexes/keys.py table_prefix of the container names): the poison
// archive's entries table, declared here; the jobs index's one table per UTC day
// (ledger<YYYYMMDD>) is created by the app as days begin, so it cannot be declared in advance.
var entriesTableName = 'poisonarchiveentries'
var consoleSettings = {
  CONSOLE_ALLOWED_ROLES: consoleAllowedRoles
  CONSOLE_ALLOWED_GROUPS: consoleAllowedGroups
  CONSOLE_CSRF_SECRET: consoleCsrfSecret
  CONSOLE_PUBLIC_ORIGINS: consolePublicOrigins
}
// Every container, and the data role each principal gets on it ('' = none). Roles are scoped to the
// container, not the account: the app identity can touch only what it uses.
// - app: the app's own documents (Contributor; Owner on the ledger, whose index tags it sets and queries), the job inputs (Reader: INPUT_CONTAINERS), and what
//   the Functions host and the platform need with identity-based AzureWebJobsStorage (Owner, as
//   documented for host storage): azure-webjobs-hosts (host id, singleton and timer locks, timer
//   schedule status), azure-webjobs-secrets (function keys) and the Flex Consumption deployment
//   container (the package the platform uploads and each instance downloads, with this identity).
//   Created here so their roles can be scoped to them; the host uses them as they are.
// - spark: the Spark service reads the job file and the inputs and writes results.
// - deployer: deploy/deploy_spark_job.sh uploads the job file.
var containerSpecs = [
  {
    // Owner, not Contributor: the app sets blob index tags in the ledger's own writes and queries
    // them (Find Blobs by Tags), which need the tags/write, tags/read and filter data actions
    // (recovery of ended claims, retention of finished records: issue 21).
    container: 'ledger'
    app: roles.storageBlobDataOwner
    spark: ''
    deployer: ''
  }
  {
    container: 'results'
    app: roles.storageBlobDataContributor
    spark: roles.storageBlobDataContributor
    deployer: ''
  }
  {
    container: 'payloads'
    app: roles.storageBlobDataContributor
    spark: ''
    deployer: ''
  }
  {
    container: 'poison-archive'
    app: roles.storageBlobDataContributor
    spark: ''
    deployer: ''
  }
  {
    container: inputContainerName
    app: roles.storageBlobDataReader
    spark: roles.storageBlobDataReader
    deployer: ''
  }
  {
    container: sparkJobsContainerName
    app: ''
    spark: roles.storageBlobDataReader
    deployer: roles.storageBlobDataContributor
  }
  {
    container: 'azure-webjobs-hosts'
    app: roles.storageBlobDataOwner
    spark: ''
    deployer: ''
  }
  {
    container: 'azure-webjobs-secrets'
    app: roles.storageBlobDataOwner
    spark: ''
    deployer: ''
  }
  {
    container: deploymentContainerName
    app: roles.storageBlobDataOwner
    spark: ''
    deployer: ''
  }
]
var livyJobFolder = 'abfss://${sparkJobsContainerName}@${storageAccountName}.dfs.${environment().suffixes.storage}'
var defaultJobFolder = sparkBackend == 'livy' ? livyJobFolder : (sparkBackend == 'databricks' ? databricksJobFolder : '')
var effectiveSparkJobFile = empty(sparkJobFile) ? (empty(defaultJobFolder) ? '' : '${defaultJobFolder}/${sparkJobBlobName}') : sparkJobFile
var effectiveSparkPyFiles = empty(sparkPyFiles) ? (empty(defaultJobFolder) ? '' : '${defaultJobFolder}/${sparkEngineZipName}') : sparkPyFiles
// Secrets (only where Entra auth cannot be used) stay in Key Vault: the app setting holds a
// Key Vault reference the platform resolves with keyVaultReferenceIdentity. Empty otherwise.
var databricksTokenReference = empty(sparkDatabricksTokenSecretUri) ? '' : '@Microsoft.KeyVault(SecretUri=${sparkDatabricksTokenSecretUri})'
var livyPasswordReference = empty(sparkLivyPasswordSecretUri) ? '' : '@Microsoft.KeyVault(SecretUri=${sparkLivyPasswordSecretUri})'

// Built-in role definition ids (the same in every tenant).
var roles = {
  storageBlobDataOwner: 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'
  storageBlobDataContributor: 'ba92f5b4-2d11-453d-a403-e96b0029c9fe'
  storageBlobDataReader: '2a2b9908-6ea1-4ae2-8e65-a410df84e7d1'
  storageQueueDataContributor: '974c5e8b-45b9-4653-ba55-5f855dd0fb88'
  storageTableDataContributor: '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'
  storageAccountContributor: '17d1049b-9a84-46fb-8f53-869881c3d3ab'
  monitoringMetricsPublisher: '3913510d-42f4-4e42-8a64-420c390055eb'
}
// Account-wide roles of the app identity, only where a narrower scope cannot be named in advance:
// tables are created as time passes, by the host (diagnostic events, AzureFunctionsDiagnosticEvents<yyyymm>)
// and by the app (the console's jobs index, ledger<YYYYMMDD>). Creating a table needs Storage Table
// Data Contributor on the account (a role on one table cannot create another); the role holds table
// data actions only. Blob and queue roles are per container and per queue (below).
var appStorageRolesBase = [
  roles.storageTableDataContributor
]
var appStorageRoles = grantStorageAccountContributor ? concat(appStorageRolesBase, [roles.storageAccountContributor]) : appStorageRolesBase

resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: identityName
  location: location
  tags: tags
}

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: storageAccountName
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: storageSku
  }
  properties: {
    accessTier: 'Hot'
    allowSharedKeyAccess: false
    allowBlobPublicAccess: false
    allowCrossTenantReplication: false
    defaultToOAuthAuthentication: true
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    publicNetworkAccess: 'Enabled'
    networkAcls: {
      defaultAction: 'Allow'
      bypass: 'AzureServices'
    }
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: storage
  name: 'default'
  properties: {
    deleteRetentionPolicy: {
      enabled: true
      days: 7
    }
    containerDeleteRetentionPolicy: {
      enabled: true
      days: 7
    }
  }
}

resource containers 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = [
  for spec in containerSpecs: {
    parent: blobService
    name: spec.container
    properties: {
      publicAccess: 'None'
    }
  }
]

// Retention (issue 21): the storage account deletes what the app no longer needs, at no cost to the
// app. Finished ledger records by their `state=done` index tag (never a record still in flight or
// poisoned), results, payloads, poison archive entries and their reasons by prefix; the archive's
// edits/ (operators' audit) and console/metrics/ (pruned by the app) have no rule. The same days
// are app settings, validated by the app at start-up against JOB_TTL_SECONDS (docs/reliability.md: Retention).
resource lifecycle 'Microsoft.Storage/storageAccounts/managementPolicies@2023-05-01' = {
  parent: storage
  name: 'default'
  properties: {
    policy: {
      rules: [
      {
        name: 'ledger-finished'
        enabled: true
        type: 'Lifecycle'
        definition: {
          filters: {
            blobTypes: [
              'blockBlob'
            ]
            prefixMatch: [
              'ledger/'
            ]
          blobIndexMatch: [
            {
              name: 'state'
              op: '=='
              value: 'done'
            }
          ]
          }
          actions: {
            baseBlob: {
              delete: {
                daysAfterModificationGreaterThan: ledgerRetentionDays
              }
            }
          }
        }
      }
      {
        name: 'results'
        enabled: true
        type: 'Lifecycle'
        definition: {
          filters: {
            blobTypes: [
              'blockBlob'
            ]
            prefixMatch: [
              'results/'
            ]
          }
          actions: {
            baseBlob: {
              delete: {
                daysAfterModificationGreaterThan: resultsRetentionDays
              }
            }
          }
        }
      }
      {
        name: 'payloads'
        enabled: true
        type: 'Lifecycle'
        definition: {
          filters: {
            blobTypes: [
              'blockBlob'
            ]
            prefixMatch: [
              'payloads/'
            ]
          }
          actions: {
            baseBlob: {
              delete: {
                daysAfterModificationGreaterThan: payloadsRetentionDays
              }
            }
          }
        }
      }
      {
        name: 'archive-jobs'
        enabled: true
        type: 'Lifecycle'
        definition: {
          filters: {
            blobTypes: [
              'blockBlob'
            ]
            prefixMatch: [
              'poison-archive/jobs/'
            ]
          }
          actions: {
            baseBlob: {
              delete: {
                daysAfterModificationGreaterThan: archiveRetentionDays
              }
            }
          }
        }
      }
      {
        name: 'archive-unparsed'
        enabled: true
        type: 'Lifecycle'
        definition: {
          filters: {
            blobTypes: [
              'blockBlob'
            ]
            prefixMatch: [
              'poison-archive/unparsed/'
            ]
          }
          actions: {
            baseBlob: {
              delete: {
                daysAfterModificationGreaterThan: archiveRetentionDays
              }
            }
          }
        }
      }
      {
        name: 'archive-reasons'
        enabled: true
        type: 'Lifecycle'
        definition: {
          filters: {
            blobTypes: [
              'blockBlob'
            ]
            prefixMatch: [
              'poison-archive/reasons/'
            ]
          }
          actions: {
            baseBlob: {
              delete: {
                daysAfterModificationGreaterThan: archiveRetentionDays + 7
              }
            }
          }
        }
      }
      ]
    }
  }
  dependsOn: [
    containers
  ]
}

resource queueService 'Microsoft.Storage/storageAccounts/queueServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource queues 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = [
  for name in queueNames: {
    parent: queueService
    name: name
  }
]

resource extraQueues 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = [
  for name in extraJobsQueueNames: {
    parent: queueService
    name: name
  }
]

resource extraPoisonQueues 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = [
  for name in extraJobsQueueNames: {
    parent: queueService
    name: format('{0}-poison', name)
  }
]

resource extraParkedQueues 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = [
  for name in extraJobsQueueNames: {
    parent: queueService
    name: format('{0}-parked', name)
  }
]

resource tableService 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource entriesTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = {
  parent: tableService
  name: entriesTableName
}

resource workspace 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: workspaceName
  location: location
  tags: tags
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: logRetentionDays
    workspaceCapping: {
      dailyQuotaGb: logDailyQuotaGb
    }
  }
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' = {
  name: appInsightsName
  location: location
  tags: tags
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: workspace.id
    DisableLocalAuth: true
    IngestionMode: 'LogAnalytics'
  }
}

var alertActions = empty(actionGroupId) ? [] : [actionGroupId]

resource poisonBacklogAlert 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: '${appInsightsName}-poison-backlog'
  location: location
  tags: tags
  properties: {
    displayName: 'Poison queue backlog for 15 minutes'
    description: 'The poison queue held messages in every sample over at least 10 minutes of the last 30 (two 15-minute samples in a row): handle_poison is not archiving them. Runbook: docs/operations.md, Alerts.'
    severity: 2
    enabled: true
    evaluationFrequency: 'PT15M'
    windowSize: 'PT30M'
    scopes: [
      appInsights.id
    ]
    criteria: {
      allOf: [
        {
          query: format('customMetrics\n| where name == "jobs.queue.depth" and tostring(customDimensions["queue"]) == "poison"\n| extend queue_name = tostring(customDimensions["queue_name"])\n| extend queue_name = iff(isempty(queue_name), "{0}", queue_name)\n| summarize lowest = min(valueMin), first = min(timestamp), last = max(timestamp) by queue_name\n| where lowest > 0 and last - first >= 10m', jobsQueueName)
          timeAggregation: 'Count'
          dimensions: [
            {
              name: 'queue_name'
              operator: 'Include'
              values: [
                '*'
              ]
            }
          ]
          operator: 'GreaterThan'
          threshold: 0
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    autoMitigate: true
    actions: {
      actionGroups: alertActions
    }
  }
}

resource oldestMessageAlert 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: '${appInsightsName}-oldest-message'
  location: location
  tags: tags
  properties: {
    displayName: 'Oldest job message older than the threshold'
    description: 'The first visible message of the jobs queue is older than oldestMessageAlertMinutes: jobs wait longer than they should (no instance processing, or a backlog). Runbook: docs/operations.md, Alerts.'
    severity: 2
    enabled: true
    evaluationFrequency: 'PT15M'
    windowSize: 'PT30M'
    scopes: [
      appInsights.id
    ]
    criteria: {
      allOf: [
        {
          query: format('customMetrics\n| where name == "jobs.queue.oldest_age" and tostring(customDimensions["queue"]) == "jobs"\n| extend queue_name = tostring(customDimensions["queue_name"])\n| extend queue_name = iff(isempty(queue_name), "{1}", queue_name)\n| summarize oldest_s = max(valueMax) by queue_name\n| where oldest_s > {0} * 60', oldestMessageAlertMinutes, jobsQueueName)
          timeAggregation: 'Count'
          dimensions: [
            {
              name: 'queue_name'
              operator: 'Include'
              values: [
                '*'
              ]
            }
          ]
          operator: 'GreaterThan'
          threshold: 0
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    autoMitigate: true
    actions: {
      actionGroups: alertActions
    }
  }
}

resource failureRateAlert 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: '${appInsightsName}-failure-rate'
  location: location
  tags: tags
  properties: {
    displayName: 'Job failure rate over the threshold'
    description: 'Over the last hour, more than failureRateAlertPercent of at least 10 delivery decisions were poisoned or failed. Runbook: docs/operations.md, Alerts.'
    severity: 1
    enabled: true
    evaluationFrequency: 'PT15M'
    windowSize: 'PT1H'
    scopes: [
      appInsights.id
    ]
    criteria: {
      allOf: [
        {
          query: format('customMetrics\n| where name == "jobs.deliveries"\n| extend outcome = tostring(customDimensions["job.outcome"])\n| extend queue_name = tostring(customDimensions["queue_name"])\n| extend queue_name = iff(isempty(queue_name), "{1}", queue_name)\n| summarize total = sum(valueSum), failed = sumif(valueSum, outcome in ("poisoned", "failed")) by queue_name\n| where total >= 10 and failed * 100.0 / total > {0}', failureRateAlertPercent, jobsQueueName)
          timeAggregation: 'Count'
          dimensions: [
            {
              name: 'queue_name'
              operator: 'Include'
              values: [
                '*'
              ]
            }
          ]
          operator: 'GreaterThan'
          threshold: 0
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    autoMitigate: true
    actions: {
      actionGroups: alertActions
    }
  }
}

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  name: planName
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    tier: 'FlexConsumption'
    name: 'FC1'
  }
  properties: {
    reserved: true
  }
}

resource functionApp 'Microsoft.Web/sites@2024-04-01' = {
  name: functionAppName
  location: location
  tags: tags
  kind: 'functionapp,linux'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identity.id}': {}
    }
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    keyVaultReferenceIdentity: identity.id
    siteConfig: {
      minTlsVersion: '1.2'
      ftpsState: 'Disabled'
    }
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${storage.properties.primaryEndpoints.blob}${deploymentContainerName}'
          authentication: {
            type: 'UserAssignedIdentity'
            userAssignedIdentityResourceId: identity.id
          }
        }
      }
      scaleAndConcurrency: {
        instanceMemoryMB: instanceMemoryMB
        maximumInstanceCount: maximumInstanceCount
      }
      runtime: {
        name: 'python'
        version: '3.11'
      }
    }
  }
  dependsOn: [
    containers
    queues
    entriesTable
    appStorageRoleAssignments
    appContainerRoleAssignments
    appQueueRoleAssignments
    appExtraQueuesRoleAssignments
    appExtraPoisonQueuesRoleAssignments
    appExtraParkedQueuesRoleAssignments
    metricsPublisherRoleAssignment
  ]
}

// App settings as their own resource (as Microsoft's Flex Consumption templates do), so that
// extraAppSettings can be merged in. This replaces the whole set of app settings on every deployment.
resource appSettings 'Microsoft.Web/sites/config@2024-04-01' = {
  parent: functionApp
  name: 'appsettings'
  properties: union(extraAppSettings, {
    AzureWebJobsStorage__accountName: storage.name
    AzureWebJobsStorage__credential: 'managedidentity'
    AzureWebJobsStorage__clientId: identity.properties.clientId
    // The console's indexes (shared/storage/tables.py) and the host's diagnostic events, with the identity.
    AzureWebJobsStorage__tableServiceUri: storage.properties.primaryEndpoints.table
    AZURE_CLIENT_ID: identity.properties.clientId
    APPLICATIONINSIGHTS_CONNECTION_STRING: appInsights.properties.ConnectionString
    APPLICATIONINSIGHTS_AUTHENTICATION_STRING: 'ClientId=${identity.properties.clientId};Authorization=AAD'
    // With host.json "telemetryMode": "OpenTelemetry": the worker exports its own logs and traces
    // (shared/config/telemetry.py) and the host stops forwarding them, so nothing arrives twice.
    PYTHON_ENABLE_OPENTELEMETRY: 'true'
    // The Python worker runs the sync functions of all triggers on one thread pool, by default
    // min(32, vCPUs + 4) threads. 24 = host.json batchSize 16 + newBatchThreshold 8: every message the
    // host fetches for process_job can run at once (the work waits on storage and Spark, not the CPU).
    PYTHON_THREADPOOL_THREAD_COUNT: '24'
    JOBS_QUEUE: jobsQueueName
    JOBS_QUEUES: empty(extraJobsQueueNames) ? '' : join(concat([jobsQueueName], extraJobsQueueNames), ',')
    LEDGER_CONTAINER: 'ledger'
    RESULTS_CONTAINER: 'results'
    PAYLOADS_CONTAINER: 'payloads'
    POISON_ARCHIVE_CONTAINER: 'poison-archive'
    INPUT_CONTAINERS: inputContainerName
    MAX_ATTEMPTS: string(maxAttempts)
    // The http kind (shared/jobs/http_payload.py) and its retry policy (shared/jobs/kinds.py). Its secret
    // headers' values are HTTP_SECRET_<NAME> settings: pass them in extraAppSettings as Key Vault references,
    // each with HTTP_SECRET_<NAME>_HOSTS (the destinations it may be sent to; required).
    HTTP_ALLOWED_HOSTS: httpAllowedHosts
    HTTP_CONNECT_TIMEOUT_SECONDS: string(httpConnectTimeoutSeconds)
    HTTP_FOLLOW_REDIRECTS: httpFollowRedirects ? 'true' : 'false'
    HTTP_INLINE_BODY_BYTES: string(httpInlineBodyBytes)
    HTTP_MAX_BODY_BYTES: string(httpMaxBodyBytes)
    HTTP_MAX_ATTEMPTS: string(httpMaxAttempts == 0 ? maxAttempts : httpMaxAttempts)
    HTTP_RETRY_BASE_SECONDS: string(httpRetryBaseSeconds)
    HTTP_RETRY_MAX_SECONDS: string(httpRetryMaxSeconds)
    HTTP_RETRY_JITTER: httpRetryJitter ? 'true' : 'false'
    LEDGER_RETENTION_DAYS: string(ledgerRetentionDays)
    RESULTS_RETENTION_DAYS: string(resultsRetentionDays)
    PAYLOADS_RETENTION_DAYS: string(payloadsRetentionDays)
    ARCHIVE_RETENTION_DAYS: string(archiveRetentionDays)
    SPARK_BACKEND: sparkBackend
    SPARK_URL: sparkUrl
    SPARK_LIVY_AUTH: sparkLivyAuth
    SPARK_LIVY_USER: sparkLivyUser
    SPARK_LIVY_PASSWORD: livyPasswordReference
    SPARK_JOB_FILE: effectiveSparkJobFile
    SPARK_PY_FILES: effectiveSparkPyFiles
    SPARK_OFFLOAD_THRESHOLD_BYTES: string(sparkOffloadThresholdBytes)
    SPARK_DATABRICKS_CLUSTER_ID: sparkDatabricksClusterId
    SPARK_DATABRICKS_AUTH: empty(sparkDatabricksTokenSecretUri) ? 'entra' : 'token'
    SPARK_DATABRICKS_TOKEN: databricksTokenReference
  }, consoleSettings)
}

// The app identity on the storage account: the account-wide roles above (plus the optional control-plane one).
resource appStorageRoleAssignments 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for roleId in appStorageRoles: {
    name: guid(storage.id, identity.id, roleId)
    scope: storage
    properties: {
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleId)
      principalId: identity.properties.principalId
      principalType: 'ServicePrincipal'
    }
  }
]

// The app identity on each container it uses (containerSpecs: app).
resource appContainerRoleAssignments 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for (spec, i) in containerSpecs: if(!empty(spec.app)) {
    name: guid(containers[i].id, identity.id, spec.app)
    scope: containers[i]
    properties: {
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', spec.app)
      principalId: identity.properties.principalId
      principalType: 'ServicePrincipal'
    }
  }
]

// The console's sign-in (issue 12): App Service Authentication with Entra ID. Anonymous requests
// still reach the app (producers call /api/jobs with function keys); the console itself requires
// the principal Easy Auth passes on, with an allowed role or group (shared/interfaces/console/security.py).
resource consoleAuth 'Microsoft.Web/sites/config@2024-04-01' = if (!empty(consoleClientId)) {
  parent: functionApp
  name: 'authsettingsV2'
  properties: {
    platform: {
      enabled: true
    }
    globalValidation: {
      requireAuthentication: false
      unauthenticatedClientAction: 'AllowAnonymous'
    }
    identityProviders: {
      azureActiveDirectory: {
        enabled: true
        registration: {
          clientId: consoleClientId
          openIdIssuer: '${environment().authentication.loginEndpoint}${tenant().tenantId}/v2.0'
        }
        validation: {
          allowedAudiences: [
            'api://${consoleClientId}'
            consoleClientId
          ]
        }
      }
    }
    login: {
      tokenStore: {
        enabled: true
      }
    }
    httpSettings: {
      requireHttps: true
    }
  }
}

// The app identity on each queue: the host's queue triggers receive, and move poison messages to
// <queue>-poison; the app sends, and the sweeper peeks, receives and deletes; run_op_step works
// through <queue>-ops and re-sends its next steps there.
resource appQueueRoleAssignments 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for (queueName, i) in queueNames: {
    name: guid(queues[i].id, identity.id, roles.storageQueueDataContributor)
    scope: queues[i]
    properties: {
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageQueueDataContributor)
      principalId: identity.properties.principalId
      principalType: 'ServicePrincipal'
    }
  }
]

resource appExtraQueuesRoleAssignments 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for (name, i) in extraJobsQueueNames: {
    name: guid(extraQueues[i].id, identity.id, roles.storageQueueDataContributor)
    scope: extraQueues[i]
    properties: {
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageQueueDataContributor)
      principalId: identity.properties.principalId
      principalType: 'ServicePrincipal'
    }
  }
]

resource appExtraPoisonQueuesRoleAssignments 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for (name, i) in extraJobsQueueNames: {
    name: guid(extraPoisonQueues[i].id, identity.id, roles.storageQueueDataContributor)
    scope: extraPoisonQueues[i]
    properties: {
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageQueueDataContributor)
      principalId: identity.properties.principalId
      principalType: 'ServicePrincipal'
    }
  }
]

resource appExtraParkedQueuesRoleAssignments 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for (name, i) in extraJobsQueueNames: {
    name: guid(extraParkedQueues[i].id, identity.id, roles.storageQueueDataContributor)
    scope: extraParkedQueues[i]
    properties: {
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageQueueDataContributor)
      principalId: identity.properties.principalId
      principalType: 'ServicePrincipal'
    }
  }
]

// Entra-authenticated telemetry (DisableLocalAuth: true) needs Monitoring Metrics Publisher.
resource metricsPublisherRoleAssignment 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(appInsights.id, identity.id, roles.monitoringMetricsPublisher)
  scope: appInsights
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.monitoringMetricsPublisher)
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}

resource sparkContainerRoleAssignments 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for (spec, i) in containerSpecs: if(!empty(sparkPrincipalId) && !empty(spec.spark)) {
    name: guid(containers[i].id, sparkPrincipalId, spec.spark)
    scope: containers[i]
    properties: {
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', spec.spark)
      principalId: sparkPrincipalId
      principalType: 'ServicePrincipal'
    }
  }
]

resource deployerContainerRoleAssignments 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for (spec, i) in containerSpecs: if(!empty(deployerPrincipalId) && !empty(spec.deployer)) {
    name: guid(containers[i].id, deployerPrincipalId, spec.deployer)
    scope: containers[i]
    properties: {
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', spec.deployer)
      principalId: deployerPrincipalId
      principalType: deployerPrincipalType
    }
  }
]

output functionAppName string = functionApp.name
output functionAppHostName string = functionApp.properties.defaultHostName
output storageAccountName string = storage.name
output sparkJobsContainer string = sparkJobsContainerName
output inputContainer string = inputContainerName
output sparkJobFile string = effectiveSparkJobFile
output sparkPyFiles string = effectiveSparkPyFiles
output identityName string = identity.name
output identityClientId string = identity.properties.clientId
output identityPrincipalId string = identity.properties.principalId
output appInsightsName string = appInsights.name
output logAnalyticsWorkspaceName string = workspace.name
